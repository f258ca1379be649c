package bpf_test

import (
	"os"
	"testing"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestWindowFirstPacketOpens: fresh maps hold a window that reads as
// expired (start_ns more than tiers.MaxWindow before the load, signed), so
// the first selected packet opens window 1 with a count of 1, as the model
// has it, whatever the host's uptime: zeroed maps started the window at
// boot, and on a host up for less than an hour an hour-long window opened
// in the middle of a test (CI's TestBytesDifferential/budgets: program and
// model a window apart at packet 885). A pinned window the program counted
// in is kept by the next load.
func TestWindowFirstPacketOpens(t *testing.T) {
	testenv.Require(t)
	pin := testenv.PinPath(t)
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	before := monotonicNow(t)
	l, err := bpf.Load(bpf.Options{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	after := monotonicNow(t)
	w, err := l.Window()
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := before-uint64(tiers.MaxWindow)-1, after-uint64(tiers.MaxWindow)-1
	if w.Opened != 0 || w.Count != 0 || w.StartNs-lo > hi-lo {
		t.Fatalf("fresh window: opened %d, count %d, start %d; want 0, 0 and a start in [%d, %d] (MaxWindow before the load)",
			w.Opened, w.Count, w.StartNs, lo, hi)
	}
	p := testPolicy(t)
	h := newHarnessWith(t, p, l)
	frame := udpSized(t, false, 1, 10)
	for range 3 {
		h.run(frame)
	}
	w = h.window()
	if w.Opened != 1 || w.Count != 3 || w.StartNs < after {
		t.Fatalf("after 3 packets: window %d, count %d, start %d; want window 1 opened by the first, count 3, start after %d", w.Opened, w.Count, w.StartNs, after)
	}

	l2, err := bpf.Load(bpf.Options{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	w2, err := l2.Window()
	if err != nil {
		t.Fatal(err)
	}
	if w2.Opened != w.Opened || w2.Count != w.Count || w2.StartNs != w.StartNs {
		t.Fatalf("reloaded over the pinned maps: window %d, count %d, start %d; want %d, %d, %d kept", w2.Opened, w2.Count, w2.StartNs, w.Opened, w.Count, w.StartNs)
	}
}
