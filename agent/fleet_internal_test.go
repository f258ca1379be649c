package agent

import (
	"github.com/tierlimit/tierlimit/agent/fleet"
	"log/slog"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// The fold for max: auto (docs/design.md §12): the agent keeps the fleet's
// table and the learnt max's, compiles the learnt max's again only when
// the auto controller applies another max, and in fallback applies the
// smaller of the fallback's max and the learnt one.
func TestFleetApplyingAuto(t *testing.T) {
	p := tiers.Default()
	p.Shape, p.Window = tiers.ShapeSmooth, time.Second
	p.Auto = &tiers.AutoMax{Start: 300, Floor: 100, Ceiling: 2000}
	p.Max = 300
	p.Fleet = &tiers.Fleet{Name: "t", Store: "redis://h", Max: 3000, Report: 100 * time.Millisecond,
		TTL: time.Second, Fallback: tiers.FallbackShare}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	a := &Agent{log: slog.New(slog.DiscardHandler)}
	a.fleet.log, a.fleet.local = a.log, func() []tiers.LocalDest { return a.local }
	a.fleet.given = p
	a.fleet.boundFor(p, true)
	b0 := a.fleet.bound.Load()
	if b0 == nil || b0.max != 300 || b0.local.Bounds[0] != 210 || b0.fleet.Bounds[0] != 2100 {
		t.Fatalf("bound %+v; want the tables for 300 and fleet.max 3000", b0)
	}
	side := (*fleetSide)(a)
	sums := func(in, total uint64) fleet.Sums { return fleet.Sums{In: in, Total: total} }
	if o := side.fleet.fold(sums(1000, 1000), sums(500, 500)); o.In <= 500 || o.Total != o.In {
		t.Errorf("bound(1000, 500) = %+v; want more than the sums, equal: the learnt max binds", o)
	}
	if o := side.fleet.fold(sums(100, 100), sums(500, 500)); o != sums(500, 500) {
		t.Errorf("bound(100, 500) = %+v; want the sums, below the learnt max", o)
	}
	// Over budget, the others' too: the in-budget sum as without, the
	// total as much higher, and more for the member's own over-budget
	// share.
	if o := side.fleet.fold(sums(1000, 1500), sums(500, 900)); o.In <= 500 || o.Total < o.In+400 {
		t.Errorf("bound((1000, 1500), (500, 900)) = %+v; want in above 500, total at least in + the others' 400 over budget", o)
	}

	// The same max again: nothing compiled.
	if q := a.fleet.applying(p); q.Fleet == nil || a.fleet.bound.Load() != b0 {
		t.Errorf("the same max: applied %v, bound replaced %v", q.Fleet, a.fleet.bound.Load() != b0)
	}
	// A new learnt max: its table, the fleet's kept; the given follows.
	if q := a.fleet.applying(p.WithMax(500)); q.Max != 500 || q.Fleet == nil {
		t.Errorf("applied max %d fleet %v; want 500 with the fleet", q.Max, q.Fleet)
	}
	b1 := a.fleet.bound.Load()
	if b1 == b0 || b1.max != 500 || b1.local.Bounds[0] != 350 || &b1.fleet.Thresholds[0] != &b0.fleet.Thresholds[0] {
		t.Errorf("after max 500: bound %+v", b1)
	}
	if a.fleet.given.Max != 500 {
		t.Errorf("given max %d; want the learnt 500", a.fleet.given.Max)
	}

	// In fallback: min(share, learnt), fleet off.
	a.fleet.in, a.fleet.members = true, 2
	if q := a.fleet.applying(a.fleet.given); q.Fleet != nil || q.Max != 500 {
		t.Errorf("fallback share 1500 with learnt 500: max %d fleet %v; want 500, off", q.Max, q.Fleet)
	}
	a.fleet.members = 10
	if q := a.fleet.applying(a.fleet.given); q.Max != 300 {
		t.Errorf("fallback share 300 with learnt 500: max %d; want 300", q.Max)
	}
	// A fleet without auto has no fold.
	p.Auto, p.Max = nil, 1000
	a.fleet.boundFor(p, true)
	if a.fleet.bound.Load() != nil || side.fleet.fold(sums(1000, 1000), sums(500, 600)) != sums(500, 600) {
		t.Error("without auto: a fold is left")
	}
}
