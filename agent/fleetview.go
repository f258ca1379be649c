package agent

import (
	"context"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// written writes, after each apply of given in state st (applyMu held),
// the fallback the program applies alone once the fleet's view expires
// (docs/design.md §12, "A view that expires"; tiers.FleetAlone), and,
// with a fleet whose controller has not started, an expired view: a
// program the agent just loaded, or adopted pins, judges on the fallback
// until the controller's first report, never on a view it has not read.
// A failed write is logged: the policy is in force all the same.
func (f *fleetState) written(lim *bpf.Limiter, given tiers.Policy, st tiers.State) {
	if err := lim.SetFleetFallback(tiers.FleetAlone(given, st)); err != nil {
		f.log.Error("fleet: write the fallback the program applies alone", "err", err)
	}
	if given.Fleet != nil && !f.started {
		if err := lim.SetFleetView(0, 0, 0); err != nil {
			f.log.Error("fleet: write the expired view before the first report", "err", err)
		}
	}
}

// View is fleet.Viewer: at each report answered whose member count or
// last share changed, the controller says what they are now. The agent
// keeps them for its fallback (tiers.State Members, LastShare) and writes
// the fallback the program applies alone; in fallback, a last share that
// changed (fallback last's decay to share) is applied.
func (s *fleetSide) View(members int, last uint64) error {
	a := (*Agent)(s)
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if a.closed.Load() {
		return errClosed
	}
	changed := a.fleet.last != last
	a.fleet.members, a.fleet.last = members, last
	if a.fleet.in && changed {
		return a.apply(context.Background(), a.given, inForce{a})
	}
	st := tiers.State{LearntMax: a.auto.Load().Learnt(a.given), Fallback: a.fleet.in, Members: members, LastShare: last}
	return a.lim.SetFleetFallback(tiers.FleetAlone(a.given, st))
}
