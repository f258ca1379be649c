package fleet

import (
	"sync/atomic"

	"github.com/tierlimit/tierlimit/tiers"
)

// AutoBound holds a member with max: auto to the pass probability of its
// learnt max on its own R̂ (docs/design.md §12, "With max: auto"): its
// Fold is the member's Config.Bound. The agent sets the two tables it
// folds with whenever the policy or the learnt max changes; the report
// loop reads them without a lock, so a report never waits for the agent.
// The zero AutoBound folds nothing.
type AutoBound struct {
	t atomic.Pointer[autoTables]
}

// autoTables is the table of the fleet's policy (fleet.max) and the one
// of its learnt max alone (tiers.Policy.Local).
type autoTables struct {
	fleet, local tiers.Table
}

// Set makes Fold hold the member to local, the table of its learnt max,
// within fleet, the table of the fleet's policy.
func (b *AutoBound) Set(fleet, local tiers.Table) {
	b.t.Store(&autoTables{fleet: fleet, local: local})
}

// Clear makes Fold return the sums as they are: no max: auto.
func (b *AutoBound) Clear() { b.t.Store(nil) }

// Fold is a Config.Bound: the others' sums that hold this member, whose
// estimates are own, to its learnt max (tiers.FleetOthersWithAuto), or
// others as they are when no tables are set. Packets per window.
func (b *AutoBound) Fold(own, others Sums) Sums {
	t := b.t.Load()
	if t == nil {
		return others
	}
	in, total := tiers.FleetOthersWithAuto(t.fleet, t.local, own.In, own.Total, others.In, others.Total)
	return Sums{In: in, Total: total}
}
