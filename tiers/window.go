package tiers

import "time"

// WindowCounts is the shared window as the program's map holds it
// (bpf.Window.Counts): its start on CLOCK_MONOTONIC, its count and the
// previous window's, the windows opened, the drop debt, and the smooth
// shape's gap and onset (docs/design.md §9), and the tick it opened at as
// the smooth estimate counts it (StartTick; read with WindowPolicy.TickNs).
type WindowCounts struct {
	StartNs, Count, LastCount, Opened, Debt, Gap uint64
	Onset                                        bool
	StartTick                                    uint64
}

// WindowPolicy is what the window's state depends on of the policy in
// force (bpf.Active.WindowPolicy): the window's length, its ticks as the
// smooth estimate counts them (Settings.SmoothTicks), the tier starts as
// the table applies them, the shape, and whether sources have a budget.
//
// TickNs is the smooth estimate's tick in ns as the program counts it
// (bpf.Limiter.TickNs), and Gate whether the program's tick gate is on
// (its ticks are jiffies). With TickNs set, the ticks since the window
// opened are the program's (smooth.h): under the gate the ns since the
// start over TickNs, else now's tick (ns >> SmoothTickShift) less
// WindowCounts.StartTick. With TickNs 0 they are the ns since the start
// over the window's length ÷ Ticks.
type WindowPolicy struct {
	Window   time.Duration
	Ticks    uint64
	Bounds   []uint64
	Shape    Shape
	Budgeted bool
	TickNs   uint64
	Gate     bool
}

// WindowState is the window's state as of one moment.
type WindowState struct {
	// Elapsed is the time since the window opened: 0 before it (a clock
	// read before the opening packet's); ElapsedTicks the same in whole
	// ticks of the smooth estimate (WindowPolicy.TickNs).
	Elapsed      time.Duration
	ElapsedTicks uint64
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
// (CLOCK_MONOTONIC ns): the snapshot behind /metrics and status, the
// controllers and the fleet's estimate (bpf.Limiter.FleetEstimate) read
// the window through it.
func WindowNow(now uint64, w WindowCounts, p WindowPolicy) WindowState {
	s := WindowState{Count: w.Count, LastCount: w.LastCount, Debt: w.Debt, Estimate: w.Count}
	if now > w.StartNs {
		s.Elapsed = time.Duration(now - w.StartNs)
	}
	s.ElapsedTicks = p.ticksSince(now, w)
	if w.Opened > 0 && int64(now-w.StartNs) > int64(p.Window) {
		s.Expired = true
		s.Count, s.LastCount, s.Debt, s.Estimate = 0, w.Count, 0, 0
	}
	if s.Count == 0 {
		return s
	}
	if p.Shape == ShapeSmooth && now >= w.StartNs {
		c := SmoothState{Elapsed: s.ElapsedTicks, Ticks: p.Ticks, Gap: w.Gap, Prev: w.LastCount}.Coef()
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

// ticksSince is the whole ticks of the smooth estimate from w's start to
// now (WindowPolicy.TickNs), 0 before the start.
func (p WindowPolicy) ticksSince(now uint64, w WindowCounts) uint64 {
	switch {
	case p.TickNs == 0:
		if now < w.StartNs {
			return 0
		}
		return (now - w.StartNs) / max(uint64(p.Window)/max(p.Ticks, 1), 1)
	case p.Gate:
		// Signed, as window.h window_expired compares: a window
		// backdated past the clock's zero wraps.
		return uint64(max(int64(now-w.StartNs), 0)) / p.TickNs
	default:
		tick := now >> SmoothTickShift
		return tick - min(tick, w.StartTick)
	}
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
