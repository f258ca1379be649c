package model

import (
	"net/netip"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// EstimateAt returns the model's own live R̂_in and R̂_tot at nowNs
// (tiers.LiveEstimates): what the member reports to the fleet, as
// bpf.Limiter.FleetEstimate reads them from the program. 0, 0 before the
// first packet.
func (m *Model) EstimateAt(nowNs uint64) (in, total uint64) {
	if !m.open {
		return 0, 0
	}
	tick := nowNs / m.tickNs
	st := tiers.SmoothState{Elapsed: tick - min(tick, m.startTick), Ticks: m.ticks(), Gap: m.gap, Prev: m.prev + m.prevEx}
	expired := nowNs > m.start && nowNs-m.start > m.window
	var gapNow uint64
	if end := m.startTick + m.ticks(); tick > end {
		gapNow = tick - end
	}
	prevIn, nIn := m.prev, m.count
	if m.sketch == nil {
		prevIn, nIn = st.Prev, m.count+m.ex // every selected packet is in budget
	}
	var prof tiers.Profiles
	if m.sketch != nil {
		prof = tiers.Profiles{Prev: m.profPrev, Cur: m.prof}
	}
	return tiers.LiveEstimates(st, m.count+m.ex, prevIn, nIn, m.onset, expired, gapNow, prof)
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
// as t (tiers.Compile compiles a fleet policy for fleet.max), reporting every
// report (p.Fleet.Report when report is 0), the first report at one
// report. rand is shared by the members; nil uses math/rand/v2.
func NewFleetModel(p tiers.Policy, t tiers.Table, members int, report time.Duration, rand func() uint32) *FleetModel {
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
