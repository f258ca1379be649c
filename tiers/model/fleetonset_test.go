package model

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
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
// rules (§12) sit. On the rule that extrapolated from the window's start
// they passed 1.28, 1.65 and 2.44 × P(R_fleet) for N = 3, 10, 30; on the
// onset from the recent rate with the fleet's count only in the latch,
// 1.08, 1.20 and 1.36 × on the mean: the member's report on the old
// estimator, the base of its rise moved at an early report, and a latch
// on a light share's noise held (docs/design.md §12).
const fleetMidWindowOnset = true

// A flood on one member alone does not starve the others (docs/design.md
// §12, "The fleet's first second"): three members at 0.1 × fleet.max each,
// then member 0 at 10 × fleet.max from a random phase on, from idle and
// on live traffic (member 0 idle before, or at its 0.1 too): over the
// first window-long span from the step, members 1 and 2 each pass at least
// 0.9 × their proportional share, their offered × P(R_fleet)/R_fleet,
// summed over seeds (the scale and the prior are member 0's own).
func TestFleetModelOnsetAlone(t *testing.T) {
	const (
		fleetMax = 1000
		window   = time.Second
		seeds    = 16
	)
	p := fleetPolicy(t, fleetMax, fleetMax)
	tab := mustCompile(t, p)
	W := float64(window)
	for _, idle0 := range []bool{true, false} {
		rates := []float64{100, 100, 100}
		flood := []float64{10 * fleetMax, 100, 100}
		var off, pass [3]float64
		var share float64
		for seed := range uint64(seeds) {
			rng := rand.New(rand.NewPCG(seed, 77))
			f := NewFleetModel(p, tab, 3, 0, rng.Uint32)
			for i := range 3 {
				f.SetReportPhase(i, rng.Uint64N(f.report))
			}
			step := 3*W + rng.Float64()*W
			next := make([]float64, 3)
			for i := range next {
				next[i] = step - 2*W + rng.Float64()*W/rates[i]
			}
			if idle0 {
				next[0] = step + rng.Float64()*W/flood[0]
			}
			for {
				i := 0
				for j := range next {
					if next[j] < next[i] {
						i = j
					}
				}
				at := next[i]
				if at >= step+W {
					break
				}
				d := f.Packet(i, uint64(at))
				r := rates[i]
				if at >= step {
					r = flood[i]
					off[i]++
					if d.Verdict == tiers.VerdictPass {
						pass[i]++
					}
				}
				nx := at + W/r
				if at < step && nx >= step {
					nx = step + rng.Float64()*W/flood[i]
				}
				next[i] = nx
			}
		}
		rf := (off[0] + off[1] + off[2]) / seeds
		share = tab.Expected(uint64(rf)).Passed / rf
		for i := 1; i < 3; i++ {
			want := off[i] * share
			t.Logf("member 0 idle before %v: member %d offered %.0f, passed %.0f; its proportional share %.0f", idle0, i, off[i], pass[i], want)
			if pass[i] < 0.9*want {
				t.Errorf("member 0 idle before %v: member %d passed %.0f in the first window of member 0's flood; want at least 0.9 × its share %.0f", idle0, i, pass[i], want)
			}
		}
	}
}
