package model

import (
	"net/netip"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// EstimateAt returns the model's own live R̂_in and R̂_tot at nowNs
// (tiers.LiveEstimates): what the member reports to the fleet, the
// estimator it judges with (latched, max(S, E) at nowNs), as
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
	var lat tiers.LiveLatch
	if m.latched {
		_, ea, el := m.recent(nowNs, m.count+m.ex, m.live(m.count))
		lat = tiers.LiveLatch{Latched: true, E: ea, EIn: ea}
		if m.sketch != nil {
			lat.EIn = min(m.exhIn, m.count) + el
		}
	}
	return tiers.LiveEstimates(st, m.count+m.ex, prevIn, nIn, lat, expired, gapNow, prof)
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
// − P(R_fleet,in).
//
// The fleet's first second (docs/design.md §12): between its reports each
// member polls its own R̂_tot every report/10, and reports at once when it
// more than doubled since its last report (and is at least
// tiers.SmoothOnsetMin); during its own onset it judges on the others'
// sums scaled by its own rise since its last report (tiers.FleetScaled).
// Each member reports at its own phase (SetReportPhase; 0 by default, all
// at once, in turn). It is not safe for concurrent use.
type FleetModel struct {
	members  []*Model
	reported [][2]uint64 // in, total
	report   uint64      // ns
	poll     uint64      // ns between polls: report/10
	next     []uint64    // ns of each member's next report
	nextPoll []uint64    // and of its next poll
	early    []int       // reports each member made at a poll
	fast     []bool      // the member's last report was at a poll: it polls at FleetRiseAgain till its next regular report
}

// NewFleetModel returns a fleet of members members of policy p compiled
// as t (tiers.Compile compiles a fleet policy for fleet.max), reporting every
// report (p.Fleet.Report when report is 0), the first report at one
// report. rand is shared by the members; nil uses math/rand/v2.
func NewFleetModel(p tiers.Policy, t tiers.Table, members int, report time.Duration, rand func() uint32) *FleetModel {
	if report <= 0 && p.Fleet != nil {
		report = p.Fleet.Report
	}
	f := &FleetModel{reported: make([][2]uint64, members), report: uint64(max(report, 1)),
		next: make([]uint64, members), nextPoll: make([]uint64, members), early: make([]int, members), fast: make([]bool, members)}
	f.poll = max(f.report/10, 1)
	for i := range members {
		f.members = append(f.members, NewModel(p, t, rand))
		f.next[i], f.nextPoll[i] = f.report, f.poll
	}
	return f
}

// SetReportPhase makes member i report at phase + k × report (k ≥ 1) and
// poll at phase + k × report/10, ns; phase is taken modulo report. Call it
// before the first packet.
func (f *FleetModel) SetReportPhase(i int, phase uint64) {
	phase %= f.report
	f.next[i], f.nextPoll[i] = phase+f.report, phase+f.poll
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

// EarlyReports returns how many reports each member made at a poll, its
// R̂ having more than doubled since its last report.
func (f *FleetModel) EarlyReports() []int { return append([]int(nil), f.early...) }

// Advance runs the reports and polls due up to nowNs, in time order (ties
// in member order): at a report at t member i reports its R̂_in and R̂_tot
// at t and takes the others' sums (Model.SetFleetOthers) and its own
// report (Model.SetFleetOwn); at a poll it does so when its R̂_tot at t is
// more than twice its last report's and at least tiers.SmoothOnsetMin
// (fleet.Controller's poll).
func (f *FleetModel) Advance(nowNs uint64) {
	for {
		i, at, regular := -1, uint64(0), false
		for j := range f.members {
			if t := min(f.next[j], f.nextPoll[j]); t <= nowNs && (i < 0 || t < at) {
				i, at, regular = j, t, f.next[j] <= f.nextPoll[j]
			}
		}
		if i < 0 {
			return
		}
		m := f.members[i]
		first := false // the first report at a poll since a regular one
		if regular {
			f.fast[i] = false
			f.next[i] += f.report
			if f.nextPoll[i] == at {
				f.nextPoll[i] += f.poll
			}
		} else {
			f.nextPoll[i] += f.poll
			_, tot := m.EstimateAt(at)
			if !tiers.FleetReportNow(tot, f.reported[i][1], f.fast[i]) {
				continue
			}
			f.early[i]++
			first = !f.fast[i]
			f.fast[i] = true
		}
		in, total := m.EstimateAt(at)
		f.reported[i] = [2]uint64{in, total}
		oIn, oTot := OthersOf(f.reported, i)
		ownIn, ownTot := in, total
		if !regular {
			// At a poll the member keeps the base of its rise, its own
			// R̂ at its last regular report (0 while idle there: the
			// equal-share prior), until its next regular report
			// (fleet.Controller).
			ownIn, ownTot = m.ownIn, m.ownTot
			if first && m.ownTot < tiers.SmoothOnsetMin {
				ownIn, ownTot = 0, 0
			}
		}
		m.SetFleetOwn(ownIn, ownTot, uint64(len(f.members)))
		m.SetFleetOthers(oIn, oTot)
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

// SetFleetOwn sets what the others' sums (SetFleetOthers) answer: this
// member's own R̂_in and R̂_tot at the report, packets per window, and the
// fleet's member count the store returned, this member included. During
// its own onset the member judges on the others' sums scaled by its rise
// since the report (tiers.FleetOthersNow), and latches on
// tiers.FleetLatchMin(members) packets since its rate's reference, as the
// program does with
// bpf.Limiter.SetFleetOwn. 0, 0, 0 (the default) is the plain fleet.
func (m *Model) SetFleetOwn(in, total, members uint64) {
	m.ownIn, m.ownTot, m.members = in, total, members
}

// fleetIn is the others' in-budget sum an in-budget packet is judged on
// at own R̂_in rhat (tiers.FleetOthersNow; bpf/fleet.h tl_fleet_others_now).
func (m *Model) fleetIn(rhat uint64) uint64 {
	return tiers.FleetOthersNow(m.othersIn, rhat, m.ownIn, tiers.FleetRiseInv(m.ownIn), m.members, m.latched)
}

// fleetTot is the others' total an over-budget packet is judged on at own
// R̂_tot rtot, as fleetIn.
func (m *Model) fleetTot(rtot uint64) uint64 {
	return tiers.FleetOthersNow(m.others, rtot, m.ownTot, tiers.FleetRiseInv(m.ownTot), m.members, m.latched)
}

// Latched reports whether the model's CPU is latched in an onset
// (docs/design.md §9): what scales the fleet's sums (tiers.FleetOthersNow).
func (m *Model) Latched() bool { return m.latched }
