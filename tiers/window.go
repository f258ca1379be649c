package tiers

import "time"

// WindowCounts is the shared window as the program's map holds it
// (bpf.Window.Counts): its start on CLOCK_MONOTONIC, its count and the
// previous window's, the windows opened, the drop debt, and the smooth
// shape's gap and onset (DESIGN.md §9).
type WindowCounts struct {
	StartNs, Count, LastCount, Opened, Debt, Gap uint64
	Onset                                        bool
}

// WindowPolicy is what the window's state depends on of the policy in
// force (bpf.Active.WindowPolicy): the window's length, its ticks as the
// smooth estimate counts them (Settings.SmoothTicks), the tier starts as
// the table applies them, the shape, and whether sources have a budget.
type WindowPolicy struct {
	Window   time.Duration
	Ticks    uint64
	Bounds   []uint64
	Shape    Shape
	Budgeted bool
}

// WindowState is the window's state as of one moment.
type WindowState struct {
	// Elapsed is the time since the window opened: 0 before it (a clock
	// read before the opening packet's).
	Elapsed time.Duration
	// Expired is set once a window opened and its length has passed: the
	// next selected packet opens a new one.
	Expired bool
	// Count is n of the current window, 0 once expired; LastCount the
	// offered load of the previous window, or of the expired current one;
	// Debt the current window's drop debt, 0 once expired.
	Count, LastCount, Debt uint64
	// Tier is the tier of the latest selected packet of the current
	// window, 0 when it is empty: the tier of Count, or with the smooth
	// shape that of the estimate R̂ (Estimate) as the program computes it.
	Tier     int
	Estimate uint64
}

// WindowNow is the one reading of the window's state at now
// (CLOCK_MONOTONIC ns): the snapshot behind /metrics and status, and the
// controllers, read the window through it.
func WindowNow(now uint64, w WindowCounts, p WindowPolicy) WindowState {
	s := WindowState{Count: w.Count, LastCount: w.LastCount, Debt: w.Debt, Estimate: w.Count}
	if now > w.StartNs {
		s.Elapsed = time.Duration(now - w.StartNs)
	}
	if w.Opened > 0 && int64(now-w.StartNs) > int64(p.Window) {
		s.Expired = true
		s.Count, s.LastCount, s.Debt, s.Estimate = 0, w.Count, 0, 0
	}
	if s.Count == 0 {
		return s
	}
	if p.Shape == ShapeSmooth && now >= w.StartNs {
		tick := max(uint64(p.Window)/p.Ticks, 1)
		c := SmoothState{Elapsed: (now - w.StartNs) / tick, Ticks: p.Ticks, Gap: w.Gap, Prev: w.LastCount}.Coef()
		if p.Budgeted {
			s.Estimate = c.Sliding(w.Count) // in-budget packets never extrapolate
		} else {
			s.Estimate = c.Estimate(w.Count, w.Onset)
		}
	}
	s.Tier = TierOf(p.Bounds, s.Count)
	if p.Shape == ShapeSmooth {
		s.Tier = TierOf(p.Bounds, s.Estimate)
	}
	return s
}

// StartTick is the tick a window opened at as the smooth estimate counts
// it (smooth.h): its start jiffy under the tick gate (gate), else its
// start ns >> SmoothTickShift.
func StartTick(startNs, startJiffies uint64, gate bool) uint64 {
	if gate {
		return startJiffies
	}
	return startNs >> SmoothTickShift
}
