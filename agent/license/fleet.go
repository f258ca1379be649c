package license

import (
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// fleetPart is the guard's side of one license across a fleet
// (docs/design.md §13, §12): the fleet room adds each member's passes to
// the day's total in the round trip of its report (TakeSpend) and hands
// back the total and the member count (FleetSpent); the guard paces the
// fleet's remainder against fleet.max, the fleet's table. While the store
// is out of reach (Unreachable) the member is in fallback, on its own
// max: it paces the last remainder ÷ members on its own passes since.
type fleetPart struct {
	on       bool   // the store answered in this day
	members  int    // as the store last answered
	total    uint64 // the fleet's total the store last answered
	unacked  uint64 // own passes not yet taken by the store
	inflight uint64 // own passes taken, not yet acknowledged
	lost     bool   // the store is out of reach
	fbPerDay uint64 // the remainder ÷ members when it was lost
	fbBase   uint64 // own spend when it was lost
}

// newDay forgets the day's fleet total. The passes not yet in the store
// (unacked, in flight) stay: the store counts bytes in the day it takes
// them (docs/design.md §12, "One license for the fleet"), so they are the
// new day's, and dropping them would lose them from every day.
func (f *fleetPart) newDay() {
	f.total = 0
}

// add counts own passes not yet added to the fleet's total.
func (f *fleetPart) add(passed uint64) { f.unacked += passed }

// input fills in the law's input of a fleet member: with the store's
// answer, the fleet's spend and, the table being the fleet's, the fleet's
// offered and protected load (own × members); when the store is lost,
// the last remainder ÷ members on own passes since.
func (f *fleetPart) input(in *tiers.PaceInput, own uint64) {
	switch {
	case f.lost && f.fbPerDay > 0:
		in.PerDay = f.fbPerDay
		in.Spent = own - min(own, f.fbBase)
	case f.on && f.members > 0:
		m := uint64(f.members)
		in.Offered *= m
		in.Protected *= m
	}
}

// TakeSpend returns the bytes passed since the last acknowledged add, for
// the fleet room's report; ack(true) after the store took them, ack(false)
// when it did not (they are given again at the next report). It
// implements the fleet room's LicenseLedger.
func (g *Guard) TakeSpend() (uint64, func(ok bool)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d := g.fleet.unacked
	g.fleet.unacked, g.fleet.inflight = 0, g.fleet.inflight+d
	return d, func(ok bool) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.fleet.inflight -= min(d, g.fleet.inflight)
		if !ok {
			// Given again, whatever the day (the contract): the store
			// counts bytes in the day it takes them, and its check of a
			// retried add (agent/fleet's script subtracts what a report
			// whose answer was lost brought) needs them in the next add.
			g.fleet.unacked += d
		}
	}
}

// FleetSpent takes the fleet's total for the license day that starts at
// dayStart (the store's clock in the license's zone) and the member count
// the store returned: the day's spend is the total and what this member
// passed since it was added. The store's day rules: an answer for a later
// day than the member's starts that day; one for an earlier day (the
// member's clock ahead around the change) is ignored.
func (g *Guard) FleetSpent(dayStart time.Time, total uint64, members int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lic == nil {
		return
	}
	if !dayStart.Equal(g.day.Start) {
		if dayStart.Before(g.day.Start) {
			return
		}
		g.newDay(g.lic.DayOf(dayStart))
	}
	f := &g.fleet
	f.on, f.lost, f.members, f.total = true, false, max(members, 1), total
	g.spent = total + f.unacked + f.inflight
}

// Unreachable is called when the store is out of reach: the member paces
// the last remainder ÷ members on its own passes from now.
func (g *Guard) Unreachable() {
	g.mu.Lock()
	defer g.mu.Unlock()
	f := &g.fleet
	if g.lic == nil || f.lost {
		return
	}
	f.lost = true
	rem := g.lic.PerDay - min(g.lic.PerDay, g.spent)
	f.fbPerDay = max(rem/uint64(max(f.members, 1)), 1)
	f.fbBase = g.own
	g.cfg.Log.Warn("license: the fleet's store is out of reach: pacing the last remainder ÷ members", "remainder", rem, "members", f.members, "share", f.fbPerDay)
}
