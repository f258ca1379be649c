package bpf_test

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestMigrateFromLayout5: the state layout 5 pinned (the sketch in its
// own map, source_sketch) migrates to layout 6 (docs/design.md §11, the
// sketch the program's own, tl_sketch): the counters, over-budget ones
// among them, and the open window carry over; the pin of source_sketch is
// removed with the rest of layout 5's; and the new program's sketch starts
// empty, so a group over its budget before the upgrade passes its budget
// once more in the window of the upgrade, and no more.
func TestMigrateFromLayout5(t *testing.T) {
	pin, p := sketchSetup(t)
	old, err := bpf.LoadObject(bpf.Options{PinPath: pin, TickNs: kernelTick(t)}, "testdata/layout-5/limiter_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	ho := newHarnessWith(t, p, old)
	ho.expire()
	frame := udpFrom(t, netip.MustParseAddr("192.0.2.7"))
	for range 8 {
		ho.run(frame)
	}
	st0, w0 := ho.stats(), ho.window()
	if st0.SelectedPackets() != sketchBudget || overBudget(st0) != 8-sketchBudget {
		t.Fatalf("layout 5 counted %d selected in budget, %d over; want %d, %d", st0.SelectedPackets(), overBudget(st0), sketchBudget, 8-sketchBudget)
	}
	if _, err := os.Stat(filepath.Join(pin, "source_sketch")); err != nil {
		t.Fatalf("layout 5 pinned no source_sketch: %v", err)
	}

	l, err := bpf.Load(bpf.Options{TickNs: kernelTick(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, p, l)
	mg, err := l.Migrate(pin, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	if err := mg.Finish(l); err != nil {
		t.Fatal(err)
	}
	if err := l.PinAt(pin, pin+"-tmp"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pin, "source_sketch")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("layout 5's source_sketch still pinned after the migration: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pin, bpf.LimiterMapSourceStats)); err != nil {
		t.Errorf("layout 6's %s not pinned: %v", bpf.LimiterMapSourceStats, err)
	}
	st, w := h.stats(), h.window()
	if st.SelectedPackets() != sketchBudget || overBudget(st) != 8-sketchBudget || w.Opened != w0.Opened || w.Count != w0.Count {
		t.Fatalf("after the migration: %d selected in budget, %d over, window %d (opened %d); want %d, %d, %d (opened %d)",
			st.SelectedPackets(), overBudget(st), w.Count, w.Opened, sketchBudget, 8-sketchBudget, w0.Count, w0.Opened)
	}
	for range 8 {
		h.run(frame)
	}
	if got, want := overBudget(h.stats()), uint64(2*(8-sketchBudget)); got != want {
		t.Errorf("8 more packets of the group on the new program's empty sketch: %d over budget in all, want %d (its budget once more)", got, want)
	}
}

// TestAdoptSketch: an agent's restart (a second load on the same pinned
// maps, docs/design.md §4 "Restart") carries the source sketch from the
// program it replaces: a group over its budget stays over it in the open
// window. Without AdoptSketch the new program's empty sketch would pass
// the group's budget once more, which the third load shows; the globals of
// a layout-5 program, which hold no sketch, give ErrNoSketch.
func TestAdoptSketch(t *testing.T) {
	pin, p := sketchSetup(t)
	load := func() *harness {
		l, err := bpf.Load(bpf.Options{PinPath: pin, TickNs: kernelTick(t)})
		if err != nil {
			t.Fatal(err)
		}
		return newHarnessWith(t, p, l)
	}
	h1 := load()
	h1.expire()
	frame := udpFrom(t, netip.MustParseAddr("192.0.2.9"))
	for range 8 {
		h1.run(frame)
	}
	if got := overBudget(h1.stats()); got != 8-sketchBudget {
		t.Fatalf("first load: %d over budget, want %d", got, 8-sketchBudget)
	}

	h2 := load()
	if err := h2.l.AdoptSketch(h1.l.Globals()); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		h2.run(frame)
	}
	if got, want := overBudget(h2.stats()), uint64(8-sketchBudget+8); got != want {
		t.Errorf("after the restart with the sketch adopted: %d over budget in all, want %d (the group stays over its budget)", got, want)
	}

	h3 := load() // not adopted: the group's budget once more
	for range 8 {
		h3.run(frame)
	}
	if got, want := overBudget(h3.stats()), uint64(8-sketchBudget+8+8-sketchBudget); got != want {
		t.Errorf("after a restart without it: %d over budget in all, want %d", got, want)
	}

	old, err := bpf.LoadObject(bpf.Options{TickNs: kernelTick(t)}, "testdata/layout-5/limiter_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := h3.l.AdoptSketch(old.Globals()); !errors.Is(err, bpf.ErrNoSketch) {
		t.Errorf("AdoptSketch of a layout-5 program's globals: %v, want ErrNoSketch", err)
	}
}

// sketchBudget is the per-source budget of sketchSetup's policy, packets.
const sketchBudget = 5

// sketchSetup makes a pin directory and returns it with an ordinal policy
// of one hour's window (none ends during the test), far from its tiers,
// with a budget of sketchBudget packets per /32 source.
func sketchSetup(t *testing.T) (string, tiers.Policy) {
	t.Helper()
	Require(t)
	pin := PinPath(t)
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	p := ordinalDefault()
	p.Max, p.Window = 1_000_000, time.Hour
	p.Sources = tiers.Sources{BudgetPackets: sketchBudget, PrefixV4: 32, PrefixV6: 64}
	return pin, p
}
