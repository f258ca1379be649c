package bpf_test

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestMigrateFromLayout4: the state layout 4 (main before count: bytes)
// pinned migrates to layout 5 (docs/design.md §11): its counters and its
// open window carry over, bytes_stats is new and starts at 0, and the new
// program then counts bytes under a count: bytes policy on the carried
// window.
func TestMigrateFromLayout4(t *testing.T) {
	Require(t)
	pin := PinPath(t)
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	p := ordinalDefault()
	p.Max, p.Window = 1_000_000, time.Hour // no window ends during the test
	old, err := bpf.LoadObject(bpf.Options{PinPath: pin, TickNs: kernelTick(t)}, "testdata/layout-4/limiter_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	ho := newHarnessWith(t, p, old)
	ho.expire()
	frame := udpSized(t, false, 1, 500)
	ho.repeat(frame, 10)
	st0, w0 := ho.stats(), ho.window()
	if st0.SelectedPackets() != 10 || w0.Count != 10 {
		t.Fatalf("layout 4 counted %d selected, window %d; want 10", st0.SelectedPackets(), w0.Count)
	}

	pb := p
	pb.Count, pb.Max = tiers.CountBytes, 100_000_000
	l, err := bpf.Load(bpf.Options{TickNs: kernelTick(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, pb, l)
	mg, err := l.Migrate(pin, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	if !slices.Contains(mg.Reset, bpf.LimiterMapBytesStats+" (new)") {
		t.Errorf("migration reset %v, want bytes_stats (new) among them", mg.Reset)
	}
	if err := mg.Finish(l); err != nil {
		t.Fatal(err)
	}
	st, w := h.stats(), h.window()
	if st.SelectedPackets() != 10 || w.Count != 10 || w.Opened != w0.Opened || st.PassedBytes() != 0 {
		t.Fatalf("after the migration: %d selected, window %d (opened %d, was %d), passed bytes %d; want 10, 10, the same window, 0",
			st.SelectedPackets(), w.Count, w.Opened, w0.Opened, st.PassedBytes())
	}
	h.run(frame)
	st, w = h.stats(), h.window()
	if w.Count != 10+500 || st.PassedBytes() != 500 || st.SelectedPackets() != 11 {
		t.Fatalf("a 500-byte datagram under count: bytes: window %d, passed bytes %d, selected %d; want 510, 500, 11",
			w.Count, st.PassedBytes(), st.SelectedPackets())
	}
}
