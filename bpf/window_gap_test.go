package bpf_test

import (
	"math"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// window_open's gap in the program (issue 39 item 4): the states another
// CPU can see while a window opens, written into the window map, and 100
// smooth packets judged in each (BPF_PROG_TEST_RUN). The scene: a window
// of 3,000 packets at max 300 (10 × max) in its last tick, whose estimate
// this CPU refreshed in the tick (the control: the window's own packets,
// judged at q(S), S ≈ 3,000); a packet arriving now opens the next window
// on another CPU, which has moved start_ns, closed the overflow mark and
// written the old window's count into last_count.
//
//   - before the id moves (today's order): the old count and the old id,
//     judged as the control;
//   - after the id moves, before the count is reset: the old count with
//     the new id, judged in the new window on a count at least the
//     packet's true one: no more passes than the control;
//   - the order it replaced, count reset before the id moved: a count of
//     1 with the old id, the old window's last-tick estimate (S = n): all
//     pass. window_open no longer makes that state (TestWindowGapModel);
//     it is run to show that the check can fail.
func TestWindowGapProgram(t *testing.T) {
	p := tiers.Default()
	p.Window, p.Max = time.Second, 300
	h := newHarnessOpts(t, p, bpf.Options{})
	frame := UDP4(t, 514)
	const n, old = 100, 3000
	var w0 bpf.LimiterTlWindow
	if err := h.l.WindowMap().Lookup(uint32(0), &w0); err != nil {
		t.Fatal(err)
	}
	now := monotonicNow(t)
	j := uint64(p.Window) >> tiers.SmoothTickShift
	if now < 2*uint64(p.Window) {
		t.Skipf("the clock %v is below two windows", time.Duration(now))
	}
	// The old window: opened half a window ago by the clock, its start tick
	// a window and more back (its estimate is of its last tick: f = 1),
	// after a window of 3,000 packets.
	w0.StartNs, w0.StartJiffies = now-uint64(p.Window)/2, 0
	w0.StartTick = now>>tiers.SmoothTickShift - j - 1
	w0.Count, w0.LastCount, w0.Overflowed, w0.Gap, w0.Onset, w0.ExCount, w0.PrevEx, w0.ExhIn = old, old, 0, 0, 0, 0, 0, 0
	w0.Opened += 2
	put := func(w bpf.LimiterTlWindow) {
		t.Helper()
		if err := h.l.WindowMap().Put(uint32(0), &w); err != nil {
			t.Fatal(err)
		}
	}
	passes := func() float64 {
		t.Helper()
		st := h.stats()
		before := st.SelectedTotal(tiers.VerdictPass).Packets
		h.repeat(frame, n)
		st = h.stats()
		return float64(st.SelectedTotal(tiers.VerdictPass).Packets - before)
	}
	put(w0)
	control := passes()
	_, thr := h.tab.Smooth(old)
	want := n * (1 - tiers.DropRatio(thr))
	bound := max(control, want) + 5*math.Sqrt(max(control, want)) + 1
	// The opener's stores, which precede the id: start_ns moved, the mark
	// closed, last_count the old count.
	opening := func(w bpf.LimiterTlWindow) bpf.LimiterTlWindow {
		w.StartNs = monotonicNow(t)
		w.Overflowed = 1<<63 | (w0.Opened + 1)
		w.LastCount = w0.Count
		return w
	}
	before := opening(w0)
	put(before)
	gotBefore := passes()
	moved := opening(w0)
	moved.Opened++
	moved.StartTick = monotonicNow(t) >> tiers.SmoothTickShift
	put(moved)
	gotMoved := passes()
	replaced := opening(w0)
	replaced.Count = 1
	put(replaced)
	gotReplaced := passes()
	t.Logf("of %d packets passed: control (the old window) %.0f (q(S) expects %.1f); opening, before the id moves %.0f; after it moves, before the count is reset %.0f; the order it replaced (count 1, old id) %.0f",
		n, control, want, gotBefore, gotMoved, gotReplaced)
	if gotBefore > bound || gotMoved > bound {
		t.Errorf("while a window opens %.0f and %.0f of %d passed, want at most the control's %.0f (+5σ: %.0f)", gotBefore, gotMoved, n, control, bound)
	}
	if gotReplaced <= bound {
		t.Errorf("the state of the order it replaced passed %.0f of %d, within the control's %.0f: the check cannot fail", gotReplaced, n, bound)
	}
}
