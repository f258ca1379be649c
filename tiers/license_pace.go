package tiers

import (
	"math"
	"time"
)

// PaceInput is what the license's pacing law (License.Pace) reads for one
// window: the day, the time, what was spent, and what the agent measured.
// Byte counts are syslog payload bytes (count: bytes).
type PaceInput struct {
	// Day is the license day (DayOf(Now)); Now the time the window opens.
	Day LicenseDay
	Now time.Time
	// Window is the policy's window.
	Window time.Duration
	// Spent are the bytes passed in the day so far (the fleet's total
	// with fleet:); PerDay, when not 0, replaces the license's per_day
	// as the volume paced (a fleet member in fallback paces the last
	// remainder ÷ members on its own spend since).
	Spent, PerDay uint64
	// Offered are the selected bytes offered per window, as measured
	// (the last window's, or a short mean); 0 when not known yet.
	Offered uint64
	// BurstSpent are the bytes passed in the burst window's time before
	// this window (the last Burst.Window − Window).
	BurstSpent uint64
	// Protected are the protected bytes (severity protect) offered per
	// window, the recent peak: the floor's base.
	Protected uint64
	// Tiers are the policy's tiers, whose pass curve the law inverts;
	// ProtectBudget §7's protect_budget (0 without severity protect).
	Tiers         []Tier
	ProtectBudget Percent
}

// Pace is one window's pacing (docs/design.md §13).
type Pace struct {
	// Target are the bytes the window should pass: the remainder of the
	// day paced over the time left, (per_day − spent) × window ÷ left,
	// under the burst cap; 0 once the day is spent.
	Target uint64
	// Max is the window's byte budget, the max compiled
	// (State.LicenseMax): the max whose expected passes at the offered
	// rate (the tiers' pass curve, Table.Expected) are Target, and never
	// under Floor.
	Max uint64
	// Cap is the burst cap on this window's passes (0: none); Floor the
	// protected classes' floor under Max (0: none).
	Cap, Floor uint64
	// Left is the time left in the day.
	Left time.Duration
}

// Pace returns the window's pacing by the law of docs/design.md §13:
//
//   - the target is the remainder paced on the time left less a window
//     (the lead: half the time left under two windows; at least 1 ms):
//     T = (per_day − spent) × window ÷ (left − window), so that a late
//     tick or traffic that stops at the day's end still finds the day
//     spent,
//     so that a window that passed less than its target raises the
//     targets that follow (the law's integral correction);
//   - T is at most the burst cap: burst.max × per_day ÷ day × window,
//     and what the rolling burst window leaves,
//     burst.max × per_day ÷ day × burst.window − BurstSpent;
//   - the max is the one whose expected passes at the offered rate R are
//     T: M with Passed(M, R) = T, Passed the tiers' pass curve (the
//     ordinal expectation, which the smooth shape's P(R) is, §9), found
//     by bisection; so the tiers' shedding of more than max × P(R)/R is
//     corrected for (at 2× the average rate the default tiers pass 0.88
//     max, not max), so the spend follows the pacing line rather than
//     lagging it all day. With R at or under T (no need
//     to shed) it is LicenseMaxFor's: all of R passes;
//   - the max is at least the floor, Protected ÷ protect_budget, so that
//     §7's drop debt (at most protect_budget × max) carries every
//     protected datagram the tiers would drop: protected traffic passes
//     when the day is spent, and is counted in the spend.
//
// Max is at least 1 and at most MaxPackets.
func (l *License) Pace(in PaceInput) Pace {
	perDay := l.PerDay
	if in.PerDay != 0 {
		perDay = in.PerDay
	}
	// The remainder is paced to be spent a window before the day's end
	// (halfway through the time left, under two windows; a millisecond
	// at least, so that the target stays finite): a tick that comes late,
	// or traffic that stops at the day's end, still finds the remainder
	// spent. The target stays a window's budget at that rate.
	left := in.Day.End.Sub(in.Now)
	left = max(left-in.Window, left/2, time.Millisecond)
	pc := Pace{Left: max(in.Day.End.Sub(in.Now), 0)}
	if in.Spent < perDay {
		pc.Target = mulDiv(perDay-in.Spent, uint64(in.Window), uint64(left))
	}
	if c := l.BurstCap(in.Day); c > 0 {
		perWindow := mulDiv(c, uint64(in.Window), uint64(l.Burst.Window))
		rolling := c - min(c, in.BurstSpent)
		pc.Cap = max(1, min(perWindow, rolling))
		pc.Target = min(pc.Target, pc.Cap)
	}
	if in.ProtectBudget.micro > 0 && in.Protected > 0 {
		pc.Floor = mulDiv(in.Protected, microHundred, uint64(in.ProtectBudget.micro))
	}
	pc.Max = min(max(LicenseMaxFor(in.Tiers, pc.Target, in.Offered), pc.Floor, 1), MaxPackets)
	return pc
}

// LicenseMaxFor returns the max under which tiers pass target bytes of a
// window offered offered bytes, in expectation (LicensePassed): the least
// M with LicensePassed(tiers, M, offered) ≥ target. With offered at or
// under target (nothing need be shed) it is the larger of the max whose
// passes never exceed target (target ÷ the curve's limit, or target when
// the last tier passes some) and the one that passes all of offered
// (offered ÷ the first tier's at): a rise within the window passes at
// most limit ÷ at_1 × target (1.26 × for the default tiers) before the
// next window's law sees it. 0 for a target of 0.
func LicenseMaxFor(tiers []Tier, target, offered uint64) uint64 {
	if target == 0 {
		return 0
	}
	if offered <= target {
		m := target
		if limit := passLimit(tiers); limit > 0 {
			m = uint64(math.Ceil(float64(target) / limit))
		}
		if len(tiers) > 0 && tiers[0].At.micro > 0 {
			m = max(m, uint64(math.Ceil(float64(offered)/tiers[0].At.Ratio())))
		}
		return m
	}
	lo, hi := 1.0, float64(MaxPackets)
	if LicensePassed(tiers, hi, float64(offered)) < float64(target) {
		return MaxPackets
	}
	for range 80 { // a relative precision far under a byte
		mid := math.Sqrt(lo * hi)
		if LicensePassed(tiers, mid, float64(offered)) < float64(target) {
			lo = mid
		} else {
			hi = mid
		}
		if hi-lo < 0.5 {
			break
		}
	}
	return uint64(math.Ceil(hi))
}

// LicensePassed returns the bytes the tiers pass in expectation of a
// window offered r bytes under max m: the integral of the pass rate
// (1 − drop) from 0 to r, tier k's drop holding from m × at_k, 0 below
// the first tier (the ordinal expectation, Table.Expected, in the
// continuum; the smooth shape's P(R), §9).
func LicensePassed(tiers []Tier, m, r float64) float64 {
	passed, from, drop := 0.0, 0.0, 0.0
	for _, t := range tiers {
		at := m * t.At.Ratio()
		if at >= r {
			break
		}
		passed += (at - from) * (1 - drop)
		from, drop = at, t.Drop.Ratio()
	}
	return passed + (r-from)*(1-drop)
}

// passLimit returns the most the tiers pass of any offered load, as a
// share of max (the curve's limit), or 0 when the last tier passes some
// (there is none).
func passLimit(tiers []Tier) float64 {
	if len(tiers) == 0 || tiers[len(tiers)-1].Drop.micro < microHundred {
		return 0
	}
	last := tiers[len(tiers)-1].At.Ratio()
	return LicensePassed(tiers, 1, last)
}
