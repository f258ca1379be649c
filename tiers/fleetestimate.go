package tiers

import "sort"

// MaxFleetOthers is the largest sum of the other members' estimates that a
// member judges on, packets per window (2^46): the program keeps R̂ below
// the 2^48 its closed form's product allows (bpf/maps.h tl_fleet_others).
const MaxFleetOthers = 1 << 46

// LiveEstimates returns a member's own live R̂ (docs/design.md §12), in
// budget and in all: the estimates that a selected packet arriving now
// would be judged on, the packet itself and the fleet's others left out,
// from the window as it stands. st is the window's state with Elapsed
// counted to now and Prev the previous window's count of all selected
// packets, n the window's count of them so far; prevIn and nIn are the
// same counts of in-budget packets (without budgets, st.Prev and n), and
// onset whether the window is latched as an onset. Both estimates take
// the onset of all selected packets, so in ≤ total. When the window has
// expired (a packet now would open a new one), gapNow is the whole ticks
// from the window's end to now, and each estimate is the new window's at
// its start: the ending window's count's share of the last window's span.
//
// R̂_in is §9's estimate of the in-budget count: in an onset, its count
// extrapolated since the window opened, where the member judges its own
// in-budget packets on their recent rate (model.Model.inEstimate). A group
// whose budget is spent early in the window is then read high, which makes
// the others pass less, never more. Outside an onset, its sliding count takes
// the previous window's share from prof.Prev (or, expired, the ending
// window's from prof.Cur), as the member judges its own in-budget packets
// (SmoothProfile): zero Profiles spread them evenly, as without budgets.
func LiveEstimates(st SmoothState, n, prevIn, nIn uint64, onset, expired bool, gapNow uint64, prof Profiles) (in, total uint64) {
	if expired {
		total = SmoothState{Ticks: st.Ticks, Gap: gapNow, Prev: n}.Coef().Sliding(0)
		in = prof.Cur.Base(nIn, 0, st.Ticks, gapNow)
		return min(in, total), total
	}
	c := st.Coef()
	onset = onset || c.Onset(n)
	total = c.Estimate(n, onset)
	st.Prev = prevIn
	ci := st.Coef()
	ci.Base = prof.Prev.Base(prevIn, st.Elapsed, st.Ticks, st.Gap)
	in = ci.Estimate(nIn, onset)
	return min(in, total), total
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
