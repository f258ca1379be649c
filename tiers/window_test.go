package tiers

import (
	"testing"
	"time"
)

// TestWindowNow: a window within its length keeps its counts and its
// tier, an expired one reads as empty with its count as the last, and the
// smooth shape's tier is that of the estimate.
func TestWindowNow(t *testing.T) {
	p := WindowPolicy{Window: time.Second, Ticks: 250, Bounds: []uint64{100, 200}}
	w := WindowCounts{StartNs: 10e9, Count: 150, LastCount: 90, Opened: 7, Debt: 3}
	s := WindowNow(10e9+5e8, w, p)
	if s.Expired || s.Count != 150 || s.LastCount != 90 || s.Debt != 3 || s.Tier != 1 || s.Elapsed != 500*time.Millisecond {
		t.Errorf("within the window: %+v", s)
	}
	s = WindowNow(11e9+1, w, p)
	if !s.Expired || s.Count != 0 || s.LastCount != 150 || s.Debt != 0 || s.Tier != 0 {
		t.Errorf("expired: %+v", s)
	}
	if s = WindowNow(9e9, w, p); s.Expired || s.Elapsed != 0 || s.Count != 150 {
		t.Errorf("a clock read before the window's start: %+v", s)
	}
	// Smooth, a quarter into a window latched as an onset: the estimate
	// extrapolates the count to the whole window, into tier 2.
	p.Shape = ShapeSmooth
	w = WindowCounts{StartNs: 10e9, Count: 60, Opened: 7, Gap: 1000, Onset: true}
	s = WindowNow(10e9+25e7, w, p)
	want := SmoothState{Elapsed: 62, Ticks: 250, Gap: 1000}.Coef().Estimate(60, true)
	if s.Estimate != want || s.Tier != TierOf(p.Bounds, want) || want < 200 {
		t.Errorf("smooth: %+v, want estimate %d in tier 2", s, want)
	}
}

// TestWindowNowTicks: with the program's tick (WindowPolicy.TickNs) the
// ticks since the window opened are the program's: under the tick gate
// the ns since the start over the tick, else now's tick less the start's.
func TestWindowNowTicks(t *testing.T) {
	const tick = 1 << SmoothTickShift
	w := WindowCounts{StartNs: 10*tick + 5, Count: 1, Opened: 1, StartTick: 10}
	p := WindowPolicy{Window: time.Second, Ticks: 250, TickNs: 4e6, Gate: true}
	if s := WindowNow(w.StartNs+9e6, w, p); s.ElapsedTicks != 2 {
		t.Errorf("gate: %d ticks, want 2", s.ElapsedTicks)
	}
	if s := WindowNow(w.StartNs-1, w, p); s.ElapsedTicks != 0 {
		t.Errorf("gate, before the start: %d ticks, want 0", s.ElapsedTicks)
	}
	p.Gate = false
	if s := WindowNow(13*tick, w, p); s.ElapsedTicks != 3 {
		t.Errorf("no gate: %d ticks, want 3 (now's tick 13 less the start's 10)", s.ElapsedTicks)
	}
	if s := WindowNow(9*tick, w, p); s.ElapsedTicks != 0 {
		t.Errorf("no gate, before the start: %d ticks, want 0", s.ElapsedTicks)
	}
	p.TickNs = 0
	if s := WindowNow(w.StartNs+9e6, w, p); s.ElapsedTicks != 2 {
		t.Errorf("no tick given: %d ticks, want 9 ms over 1 s ÷ 250", s.ElapsedTicks)
	}
}
