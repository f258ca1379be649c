package agent

import (
	"github.com/tierlimit/tierlimit/agent/fleet"
	"log/slog"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// The fold for max: auto (docs/design.md §12): the agent keeps the fleet's
// table and the learnt max's, and compiles the learnt max's again only
// when the auto controller applies another max. (The fallback's max with
// max: auto is tiers.Effective's: tiers/effective_test.go.)
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
	a.fleet.log, a.fleet.started = a.log, true
	a.fleet.boundFor(p, a.local, true)
	b0 := a.fleet.tables
	if b0 == nil || b0.max != 300 || b0.local.Bounds[0] != 210 || b0.fleet.Bounds[0] != 2100 {
		t.Fatalf("bound %+v; want the tables for 300 and fleet.max 3000", b0)
	}
	fold := a.fleet.bound.Fold
	sums := func(in, total uint64) fleet.Sums { return fleet.Sums{In: in, Total: total} }
	if o := fold(sums(1000, 1000), sums(500, 500)); o.In <= 500 || o.Total != o.In {
		t.Errorf("bound(1000, 500) = %+v; want more than the sums, equal: the learnt max binds", o)
	}
	if o := fold(sums(100, 100), sums(500, 500)); o != sums(500, 500) {
		t.Errorf("bound(100, 500) = %+v; want the sums, below the learnt max", o)
	}
	// Over budget, the others' too: the in-budget sum as without, the
	// total as much higher, and more for the member's own over-budget
	// share.
	if o := fold(sums(1000, 1500), sums(500, 900)); o.In <= 500 || o.Total < o.In+400 {
		t.Errorf("bound((1000, 1500), (500, 900)) = %+v; want in above 500, total at least in + the others' 400 over budget", o)
	}

	// The same max again: nothing compiled.
	if a.fleet.follow(p, a.local); a.fleet.tables != b0 {
		t.Error("the same max: bound replaced")
	}
	// A new learnt max: its table, the fleet's kept.
	a.fleet.follow(tiers.State{LearntMax: 500}.Learnt(p), a.local)
	b1 := a.fleet.tables
	if b1 == b0 || b1.max != 500 || b1.local.Bounds[0] != 350 || &b1.fleet.Thresholds[0] != &b0.fleet.Thresholds[0] {
		t.Errorf("after max 500: bound %+v", b1)
	}
	// A fleet without auto has no fold.
	p.Auto, p.Max = nil, 1000
	a.fleet.boundFor(p, a.local, true)
	if a.fleet.tables != nil || fold(sums(1000, 1000), sums(500, 600)) != sums(500, 600) {
		t.Error("without auto: a fold is left")
	}
}
