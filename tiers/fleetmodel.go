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

// LiveEstimate returns a member's own live R̂ (docs/design.md §12): the
// estimate that a selected packet arriving now would be judged on, the
// packet itself and the fleet's others left out, from the window as it
// stands. st is the window's state with Elapsed counted to now and Prev
// the previous window's count of all selected packets, n the window's
// count so far, and onset whether the window is latched as an onset. When
// the window has expired (a packet now would open a new one), gapNow is
// the whole ticks from the window's end to now, and the estimate is the
// new window's at its start: the ending window's count's share of the
// last window's span. n and st.Prev count every selected packet, over
// budget included: with per-source budgets a member reports R̂ of all its
// offered packets, in and over budget, since the others take its report
// as in-budget load (Model.SetFleetOthers), and the fleet then passes no
// more than without budgets (docs/design.md §12).
func LiveEstimate(st SmoothState, n uint64, onset, expired bool, gapNow uint64) uint64 {
	if expired {
		return SmoothState{Ticks: st.Ticks, Gap: gapNow, Prev: n}.Coef().Sliding(0)
	}
	c := st.Coef()
	return c.Estimate(n, onset || c.Onset(n))
}

// EstimateAt returns the model's own live R̂ at nowNs (LiveEstimate): what
// the member reports to the fleet, as bpf.Limiter.FleetEstimate reads it
// from the program. 0 before the first packet.
func (m *Model) EstimateAt(nowNs uint64) uint64 {
	if !m.open {
		return 0
	}
	tick := nowNs / m.tickNs
	st := SmoothState{Elapsed: tick - min(tick, m.startTick), Ticks: m.ticks(), Gap: m.gap, Prev: m.prev + m.prevEx}
	expired := nowNs > m.start && nowNs-m.start > m.window
	var gapNow uint64
	if end := m.startTick + m.ticks(); tick > end {
		gapNow = tick - end
	}
	return LiveEstimate(st, m.count+m.ex, m.onset, expired, gapNow)
}

// FleetModel is the reference model of a fleet (docs/design.md §12): its
// members, each a Model of the same policy with its own stream of
// selected packets, judge on their own live R̂ plus the others' last
// reported sum. Every report each member, in turn, publishes its own live
// R̂ (Model.EstimateAt) and reads the sum of the others' latest reports,
// as the store's script returns it. The fleet as a whole then passes what
// one limiter of fleet.max would pass on all of its traffic, P(R_fleet),
// each member the same fraction of its offered load. It is not safe for
// concurrent use.
type FleetModel struct {
	members  []*Model
	reported []uint64
	report   uint64 // ns
	next     uint64 // ns of the next report
}

// NewFleetModel returns a fleet of members members of policy p compiled
// as t (Compile compiles a fleet policy for fleet.max), reporting every
// report (p.Fleet.Report when report is 0), the first report at one
// report. rand is shared by the members; nil uses math/rand/v2.
func NewFleetModel(p Policy, t Table, members int, report time.Duration, rand func() uint32) *FleetModel {
	if report <= 0 && p.Fleet != nil {
		report = p.Fleet.Report
	}
	f := &FleetModel{reported: make([]uint64, members), report: uint64(max(report, 1))}
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

// Reported returns each member's latest report, packets per window.
func (f *FleetModel) Reported() []uint64 { return append([]uint64(nil), f.reported...) }

// Advance runs the reports due up to nowNs (each report time t ≤ nowNs):
// at each, every member in turn reports its R̂ at t and takes the others'
// sum (Model.SetFleetOthers).
func (f *FleetModel) Advance(nowNs uint64) {
	for ; f.next <= nowNs; f.next += f.report {
		for i, m := range f.members {
			f.reported[i] = m.EstimateAt(f.next)
			m.SetFleetOthers(othersOf(f.reported, i))
		}
	}
}

// othersOf is the sum of reported but i's.
func othersOf(reported []uint64, i int) uint64 {
	var s uint64
	for j, r := range reported {
		if j != i {
			s += r
		}
	}
	return s
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

// FleetOthersWithAuto returns the others' sum that a member with max: auto
// writes into its program (docs/design.md §12: its pass probability is the
// smaller of the fleet's and that of its auto-learnt max on its own R̂).
// fleet is the table for fleet.max, local the table for the learnt max
// (Compile of Policy.WithMax with Fleet nil), own the member's live R̂ and
// others the fleet's reported sum. When the fleet's drop threshold at own
// + others is at least the local one at own, it returns others; else the
// least sum at which the fleet's threshold reaches the local one, found by
// bisection (the thresholds grow with R̂ when the drop percents grow with
// the tiers, as the default's do), at most MaxFleetOthers. The fold is the
// agent's, once per report: the local bound follows own R̂ at the report's
// pace, where the fleet's follows it per packet.
func FleetOthersWithAuto(fleet, local Table, own, others uint64) uint64 {
	others = min(others, MaxFleetOthers)
	_, want := local.Smooth(own)
	if _, thr := fleet.Smooth(own + others); thr >= want {
		return others
	}
	n := MaxFleetOthers - others
	i := uint64(sort.Search(int(min(n, 1<<62)), func(k int) bool {
		_, thr := fleet.Smooth(own + others + uint64(k))
		return thr >= want
	}))
	return others + i
}
