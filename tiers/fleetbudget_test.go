package tiers

import (
	"testing"
	"time"
)

// A budget's percent is of the member's own max, the max it judges on
// alone (docs/design.md §12): the policy's max, not fleet.max; in
// fallback share, fleet.max ÷ the members, its max then.
func TestFleetSourcesBudget(t *testing.T) {
	p := fleetPolicy(t, 200000, 1000)
	p.Sources = Sources{Budget: Pct(10), PrefixV4: 32, PrefixV6: 64}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := mustCompile(t, p).Sources.Budget; got != 100 {
		t.Errorf("budget 10 %% with max 1000, fleet.max 200000: %d packets, want 100", got)
	}
	if got := mustCompile(t, p.FleetFallbackPolicy(4)).Sources.Budget; got != 5000 {
		t.Errorf("in fallback share of 4 members: %d packets, want 10 %% of 50000 = 5000", got)
	}
	p.Fleet.Fallback = FallbackLocal
	if got := mustCompile(t, p.FleetFallbackPolicy(4)).Sources.Budget; got != 100 {
		t.Errorf("in fallback local: %d packets, want 100", got)
	}
}

// fleetPolicy is the default policy's tiers, smooth, with a fleet of
// fleet.max fleetMax and a local max of localMax.
func fleetPolicy(t *testing.T, fleetMax, localMax uint64) Policy {
	t.Helper()
	p := Default()
	p.Shape, p.Max = ShapeSmooth, localMax
	p.Fleet = &Fleet{Name: "t", Store: "redis://h", Max: fleetMax, Report: 100 * time.Millisecond, TTL: 3 * time.Second}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}
