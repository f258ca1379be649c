package tiers

import "sort"

// MaxFleetOthers is the largest sum of the other members' estimates that a
// member judges on, packets per window (2^46): the program keeps R̂ below
// the 2^48 its closed form's product allows (bpf/maps.h tl_fleet_others).
const MaxFleetOthers = 1 << 46

// LiveEstimates returns a member's own live R̂ (docs/design.md §12), in
// budget and in all: the estimates that a selected packet arriving now
// would be judged on, the packet itself and the fleet's others left out,
// from the window as it stands; a member reports with the estimator it
// judges with (issue 39). st is the window's state with Elapsed counted
// to now and Prev the previous window's count of all selected packets, n
// the window's count of them so far; prevIn and nIn are the same counts
// of in-budget packets (without budgets, st.Prev and n), and lat the
// latch of the onset from the recent rate (§9) as it stands now. When the
// window has expired (a packet now would open a new one), gapNow is the
// whole ticks from the window's end to now, and each estimate is the new
// window's at its start: the ending window's count's share of the last
// window's span.
//
// R̂_tot is S, the sliding count, and latched max(S, E), E the recent
// rate of all selected packets over a window (model.Model.smooth). R̂_in
// is the in-budget sliding count, which takes the previous window's share
// from prof.Prev (or, expired, the ending window's from prof.Cur), as the
// member judges its own in-budget packets (SmoothProfile; zero Profiles
// spread them evenly, as without budgets), and latched the most of it and
// lat.EIn (model.Model.inEstimate). in ≤ total. Before issue 39's rule
// it reported F = n/f, extrapolated from the window's start with the 1/32
// floor, while the program judged on E: after a flood mid-window a member
// reported a tenth of its rate, and another member's light groups lost 28
// of 500 in an onset window (TestLiveEstimatesJudged).
func LiveEstimates(st SmoothState, n, prevIn, nIn uint64, lat LiveLatch, expired bool, gapNow uint64, prof Profiles) (in, total uint64) {
	if expired {
		total = SmoothState{Ticks: st.Ticks, Gap: gapNow, Prev: n}.Coef().Sliding(0)
		in = prof.Cur.Base(nIn, 0, st.Ticks, gapNow)
		return min(in, total), total
	}
	total = st.Coef().Sliding(n)
	st.Prev = prevIn
	ci := st.Coef()
	ci.Base = prof.Prev.Base(prevIn, st.Elapsed, st.Ticks, st.Gap)
	in = ci.Sliding(nIn)
	if lat.Latched {
		total = max(total, lat.E)
		in = max(in, lat.EIn)
	}
	return min(in, total), total
}

// LiveLatch is a member's latch of the onset from the recent rate (docs/design.md
// §9) as LiveEstimates reads it: whether a CPU is latched, and then E, the
// rate of all selected packets over a window, and EIn, the latched part of
// the in-budget estimate (without budgets E; with budgets the spent
// budgets plus the live groups' rate, model.Model.inEstimate), as the
// program would judge a packet now. The program's CPUs each read the
// host's whole count; the agent takes the most of the latched ones.
type LiveLatch struct {
	Latched bool
	E, EIn  uint64
}

// Profiles are the in-budget profiles LiveEstimates reads: of the
// previous window, and of the current one.
type Profiles struct{ Prev, Cur SmoothProfile }

// FleetOthersWithAuto returns the others' sums that a member with max:
// auto writes into its program (docs/design.md §12: its pass probability
// is the smaller of the fleet's and that of its auto-learnt max on its own
// R̂). fleet is the table for fleet.max, local the table for the learnt
// max (Compile of Policy.WithMax with Fleet nil), ownIn and ownTot the
// member's live R̂_in and R̂_tot, and othersIn and othersTot the fleet's
// reported sums. The in-budget sum is the least, at least othersIn, at
// which the fleet's drop threshold at ownIn + in reaches the local one at
// ownIn; the total keeps the others' over-budget part on top of it, and
// when the member has traffic over budget (ownTot > ownIn) grows further,
// to the least at which the fleet's over-budget share threshold
// (Table.ShareThreshold) reaches the local one of (ownIn, ownTot). Both
// are found by bisection (the thresholds grow with R̂ when the drop
// percents grow with the tiers, as the default's do) and are at most
// MaxFleetOthers, in at most total. The fold is the agent's, once per
// report: the local bound follows own R̂ at the report's pace, where the
// fleet's follows it per packet.
func FleetOthersWithAuto(fleet, local Table, ownIn, ownTot, othersIn, othersTot uint64) (in, total uint64) {
	othersTot = min(othersTot, MaxFleetOthers)
	othersIn = min(othersIn, othersTot)
	_, want := local.Smooth(ownIn)
	in = leastFrom(othersIn, func(o uint64) bool {
		_, thr := fleet.Smooth(ownIn + o)
		return thr >= want
	})
	total = min(othersTot+(in-othersIn), MaxFleetOthers)
	if ownTot > ownIn {
		wantEx := local.ShareThreshold(ownIn, ownTot)
		total = leastFrom(total, func(o uint64) bool {
			return fleet.ShareThreshold(ownIn+in, ownTot+o) >= wantEx
		})
	}
	return min(in, total), total
}

// leastFrom returns the least o in [from, MaxFleetOthers] for which ok
// holds, ok false below it and true from it on; MaxFleetOthers when it
// holds nowhere.
func leastFrom(from uint64, ok func(o uint64) bool) uint64 {
	from = min(from, MaxFleetOthers)
	if ok(from) {
		return from
	}
	n := MaxFleetOthers - from
	return from + uint64(sort.Search(int(n), func(k int) bool { return ok(from + uint64(k)) }))
}

// The fleet's first second (docs/design.md §12): a flood behind a balancer
// reaches every member at once, and each learns the others' rise only
// from their reports. Until then a member judges on the others' sums as
// FleetOthersNow scales them, reports early (FleetReportNow), and latches
// and releases its onset on the fleet's count (FleetLatchMin).

// FleetRiseCap is the most a member scales the others' sums by during its
// own onset (its CPU latched): its own R̂ now over the base, its R̂ at
// its last regular report (FleetReportNow's early reports keep it), at
// most 16.
// Behind a balancer a surge is correlated, and the others' sums, reported
// before it, stand for what has risen as this member's R̂ has: the scale
// is its best guess of their rise until its next regular report. Where the
// member surged alone the scale over-sheds it until its next regular
// report; 16 covers a step from 0.6 ×
// fleet.max to 10 × fleet.max at once, and keeps the scaled sum's
// product within 64 bits (FleetScaled).
const FleetRiseCap = 16

// FleetRiseInv is 2^48 / own, 0 for own 0: what the agent writes beside
// own, a member's base (its R̂ at its last regular report), so that the program scales the
// others' sums without a division per packet (bpf/fleet.h tl_fleet_others_now,
// FleetScaled). own is below 2^48.
func FleetRiseInv(own uint64) uint64 {
	if own == 0 {
		return 0
	}
	return (1 << 48) / own
}

// FleetScaled returns the others' sum a member judges on (docs/design.md
// §12, "The fleet's first second"): others, the sum of the others' last
// reports, packets per window, as it is outside an onset, or when own
// R̂ rhat is no more than own, the base (its R̂ at its last regular
// report); during its own
// onset, others × rhat/own, at most others × FleetRiseCap (others ×
// FleetRiseCap when own is 0), and at most MaxFleetOthers. inv is
// FleetRiseInv(own). The rise is computed as the program computes it
// (bpf/fleet.h tl_fleet_others_now): (rhat − own) × inv >> 32, the rise less
// one with 16 fractional bits, exact to 2^-16 of a rise; no product
// overflows for others ≤ MaxFleetOthers and rhat, own < 2^48.
func FleetScaled(others, rhat, own, inv uint64, onset bool) uint64 {
	if !onset || others == 0 || rhat <= own {
		return others
	}
	if own == 0 || rhat-own >= (FleetRiseCap-1)*own {
		return min(others*FleetRiseCap, MaxFleetOthers)
	}
	rise := (rhat - own) * inv >> 32 // < (FleetRiseCap-1) << 16
	return min(others+mulShr(others, rise, 16), MaxFleetOthers)
}

// FleetOthersNow returns the others' sum a member judges a packet on at
// own R̂ rhat (docs/design.md §12, "The fleet's first second"): others,
// the sum of the others' last reports, outside its own onset; in it,
// FleetScaled, or, while own, the base of its rise (its R̂ at its last
// regular report), is
// below SmoothOnsetMin (the member was idle: it had no rise to scale by),
// the equal-share prior max(others, (members − 1) × rhat), members the
// fleet's count, this member included (members − 1 at most 65,535).
// members 0 (no answer since the program loaded) is the plain fleet:
// others, unscaled. inv is
// FleetRiseInv(own). At most MaxFleetOthers (bpf/smooth.h
// tl_fleet_others_now).
func FleetOthersNow(others, rhat, own, inv, members uint64, onset bool) uint64 {
	if members == 0 {
		return others
	}
	if onset && own < SmoothOnsetMin && members > 1 {
		return max(others, min(min(members-1, fleetMembersMax)*min(rhat, MaxFleetOthers), MaxFleetOthers))
	}
	return FleetScaled(others, rhat, own, inv, onset)
}

// fleetMembersMax is the most others the prior counts (bpf/consts.h
// TL_FLEET_MEMBERS_MAX): its product with a sum of at most MaxFleetOthers
// stays within 64 bits.
const fleetMembersMax = 1<<16 - 1

// FleetReportNow reports whether a member polling its own R̂_tot, est,
// between its reports reports at once (docs/design.md §12): when est is at
// least SmoothOnsetMin and more than twice last, its R̂_tot at its last
// report, or, after a report at a poll (again, until its next regular
// report), more than 5/4 of last: a flood's R̂ rises over its first ticks
// (the 1/32 floor on the elapsed fraction), and so do the others' reports.
func FleetReportNow(est, last uint64, again bool) bool {
	if est < SmoothOnsetMin {
		return false
	}
	if again {
		return est > last+last/4
	}
	return est > 2*last
}

// FleetLatchMin returns the packets since its rate's reference a fleet
// member's CPU needs to latch an onset (docs/design.md §12, "The fleet's
// first second"; SmoothLatchesFrom): SmoothOnsetMin / members rounded up,
// members the fleet's count at the last answer, this member included;
// SmoothOnsetMin alone (members below 2). A flood that reaches every
// member at once reaches each at 1/members of its rate, and the fleet has
// seen SmoothOnsetMin packets of it when each member has seen
// SmoothOnsetMin/members: on a single host's 16, 30 members of a 10 ×
// fleet.max flood latched 48 ms into it and passed 1.50 × P(R_fleet) in
// its first window (TestFleetModelOnset). The agent writes it with the
// member count (bpf.Limiter.SetFleetOwn); past the view's expiry the
// program latches on SmoothOnsetMin.
func FleetLatchMin(members uint64) uint64 {
	if members < 2 {
		return SmoothOnsetMin
	}
	return (SmoothOnsetMin + members - 1) / members
}
