package model

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// The fleet's first second (docs/design.md §12): N ∈ {3, 10, 30} members
// of equal share, flooded at once to 10 × fleet.max from idle and from 0.3
// × fleet.max of live traffic, at a random phase of the window, the tick
// and every member's reports, pass in the first window-long span from the
// step at most 1.25 × P(R_fleet) in every run and 1.1 × on the mean over
// seeds. Before the fleet's first-second rules (a member judged on the
// others' pre-flood sums until its next report) the model passed 1.33,
// 1.83 and 2.21 × from idle (mean over seeds; one host alone passes
// 1.09 ×), and 1.46, 2.21 and 3.24 × from 0.3 × fleet.max.
func TestFleetModelOnset(t *testing.T) {
	const (
		fleetMax = 1000
		window   = time.Second
		seeds    = 24
	)
	p := fleetPolicy(t, fleetMax, fleetMax)
	tab := mustCompile(t, p)
	flood := 10.0 * fleetMax
	want := tab.Expected(uint64(flood)).Passed
	for _, n := range fleetOnsetNs {
		for _, base := range []float64{0, 0.3} {
			t.Run(fmt.Sprintf("N%d/base%.1f", n, base), func(t *testing.T) {
				if base > 0 && !fleetMidWindowOnset {
					t.Skip("a flood on live traffic needs the single host's onset at any phase of a window (issue 39 item 1): set fleetMidWindowOnset when it lands")
				}
				var sum, worst float64
				for seed := range uint64(seeds) {
					rng := rand.New(rand.NewPCG(seed, uint64(n)*10+uint64(base*10)))
					f := NewFleetModel(p, tab, n, 0, rng.Uint32)
					step := uint64(3*window) + rng.Uint64N(uint64(window))
					r := float64(FleetStep(f, window, base*fleetMax, flood, step, rng)) / want
					sum += r
					worst = max(worst, r)
					if r > 1.25 {
						t.Errorf("seed %d: the first window from the step passed %.3f × P(R_fleet) %.0f; want at most 1.25 ×", seed, r, want)
					}
				}
				mean := sum / seeds
				t.Logf("first window: mean %.3f × P(R_fleet), worst %.3f × (P %.0f of %.0f per window)", mean, worst, want, flood)
				if mean > 1.1 {
					t.Errorf("the first window passed %.3f × P(R_fleet) on the mean over %d seeds; want at most 1.1 ×", mean, seeds)
				}
			})
		}
	}
}

// fleetOnsetNs are the fleet sizes TestFleetModelOnset floods.
var fleetOnsetNs = []int{3, 10, 30}

// fleetMidWindowOnset runs TestFleetModelOnset's floods on live traffic,
// which start at a random phase of a window: their first window's bound
// needs the single host's onset rule of issue 39 item 1 (docs/design.md
// §9, an onset from the recent rate at any phase), on which the fleet's
// rules (§12) sit. On the rule that extrapolates from the window's start
// they pass 1.28, 1.65 and 2.44 × P(R_fleet) for N = 3, 10, 30.
const fleetMidWindowOnset = false
