package tiers

import (
	"net/netip"
	"sort"
	"time"
)

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
// in-budget packets on their recent rate (Model.inEstimate). A group whose
// budget is spent early in the window is then read high, which makes the
// others pass less, never more. Outside an onset, its sliding count takes
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

// EstimateAt returns the model's own live R̂_in and R̂_tot at nowNs
// (LiveEstimates): what the member reports to the fleet, as
// bpf.Limiter.FleetEstimate reads them from the program. 0, 0 before the
// first packet.
func (m *Model) EstimateAt(nowNs uint64) (in, total uint64) {
	if !m.open {
		return 0, 0
	}
	tick := nowNs / m.tickNs
	st := SmoothState{Elapsed: tick - min(tick, m.startTick), Ticks: m.ticks(), Gap: m.gap, Prev: m.prev + m.prevEx}
	expired := nowNs > m.start && nowNs-m.start > m.window
	var gapNow uint64
	if end := m.startTick + m.ticks(); tick > end {
		gapNow = tick - end
	}
	prevIn, nIn := m.prev, m.count
	if m.sketch == nil {
		prevIn, nIn = st.Prev, m.count+m.ex // every selected packet is in budget
	}
	var prof Profiles
	if m.sketch != nil {
		prof = Profiles{Prev: m.profPrev, Cur: m.prof}
	}
	return LiveEstimates(st, m.count+m.ex, prevIn, nIn, m.onset, expired, gapNow, prof)
}

// FleetModel is the reference model of a fleet (docs/design.md §12): its
// members, each a Model of the same policy with its own stream of
// selected packets, judge on their own live R̂ plus the others' last
// reported sums. Every report each member, in turn, publishes its own live
// R̂_in and R̂_tot (Model.EstimateAt) and reads the sums of the others'
// latest reports, as the store's script returns them. The fleet as a
// whole then passes what one limiter of fleet.max would pass on all of its
// traffic, P(R_fleet): without budgets each member the same fraction of
// its offered load; with budgets its in-budget packets at
// p(R_fleet,in), and the fleet's over-budget packets together P(R_fleet)
// − P(R_fleet,in). It is not safe for concurrent use.
type FleetModel struct {
	members  []*Model
	reported [][2]uint64 // in, total
	report   uint64      // ns
	next     uint64      // ns of the next report
}

// NewFleetModel returns a fleet of members members of policy p compiled
// as t (Compile compiles a fleet policy for fleet.max), reporting every
// report (p.Fleet.Report when report is 0), the first report at one
// report. rand is shared by the members; nil uses math/rand/v2.
func NewFleetModel(p Policy, t Table, members int, report time.Duration, rand func() uint32) *FleetModel {
	if report <= 0 && p.Fleet != nil {
		report = p.Fleet.Report
	}
	f := &FleetModel{reported: make([][2]uint64, members), report: uint64(max(report, 1))}
	f.next = f.report
	for range members {
		f.members = append(f.members, NewModel(p, t, rand))
	}
	return f
}

// SetTick sets every member's tick (Model.SetTick).
func (f *FleetModel) SetTick(ns uint64) {
	for _, m := range f.members {
		m.SetTick(ns)
	}
}

// Member returns member i's model.
func (f *FleetModel) Member(i int) *Model { return f.members[i] }

// Reported returns each member's latest report, packets per window: its
// R̂_in and R̂_tot.
func (f *FleetModel) Reported() [][2]uint64 { return append([][2]uint64(nil), f.reported...) }

// Advance runs the reports due up to nowNs (each report time t ≤ nowNs):
// at each, every member in turn reports its R̂_in and R̂_tot at t and
// takes the others' sums (Model.SetFleetOthers).
func (f *FleetModel) Advance(nowNs uint64) {
	for ; f.next <= nowNs; f.next += f.report {
		for i, m := range f.members {
			in, total := m.EstimateAt(f.next)
			f.reported[i] = [2]uint64{in, total}
			m.SetFleetOthers(OthersOf(f.reported, i))
		}
	}
}

// OthersOf returns the sums of reported's in-budget and total estimates
// but i's, as the store's script returns them.
func OthersOf(reported [][2]uint64, i int) (in, total uint64) {
	for j, r := range reported {
		if j != i {
			in, total = in+r[0], total+r[1]
		}
	}
	return in, total
}

// Packet advances the fleet to nowNs (Advance) and judges a selected
// packet of member i arriving then (Model.Packet).
func (f *FleetModel) Packet(i int, nowNs uint64) Decision {
	f.Advance(nowNs)
	return f.members[i].Packet(nowNs)
}

// PacketFrom advances the fleet to nowNs (Advance) and judges a selected
// packet of member i from src arriving then (Model.PacketFrom): with
// per-source budgets, within src's group's budget on member i. Each
// member's sketch hashes with zero seeds, every group in one cell, until
// Member(i).SetSketchSeeds gives it its own, as each host draws at load.
func (f *FleetModel) PacketFrom(i int, nowNs uint64, src netip.Addr) Decision {
	f.Advance(nowNs)
	return f.members[i].PacketFrom(nowNs, src)
}

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
