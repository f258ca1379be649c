package tiers

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// A fleet of two on the model (docs/design.md §12, "With max: auto"):
// member 0 has max: auto with a learnt max of 300 and folds it into the
// others' sum at each report (FleetOthersWithAuto), member 1 has none.
// Offered 1000 and 3000 per window, member 0 passes its local P(1000),
// well under its fleet share 1000 × P(4000)/4000, and member 1 passes its
// fleet share 3000 × P(4000)/4000: the fold costs the others nothing, as
// member 0 reports its own R̂. From the third window on, within 5σ plus
// 3 % for the estimate's lag at the reports' pace; over seeds.
func TestFleetModelAuto(t *testing.T) {
	const (
		window  = time.Second
		report  = 100 * time.Millisecond
		windows = 8
	)
	p := fleetPolicy(t, 3000, 300)
	p.Auto = &AutoMax{Start: 300, Floor: 100, Ceiling: 2000}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	fleet := mustCompile(t, p)
	local := mustCompile(t, p.Local())
	rates := []float64{1000, 3000}
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 11))
		ms := []*Model{NewModel(p, fleet, rng.Uint32), NewModel(p, fleet, rng.Uint32)}
		var offered, passed [2][windows]int
		W := float64(window)
		next := []float64{rng.Float64() * W / rates[0], rng.Float64() * W / rates[1]}
		nextReport := uint64(report)
		for {
			i := 0
			if next[1] < next[0] {
				i = 1
			}
			now := uint64(next[i])
			for ; nextReport <= now; nextReport += uint64(report) {
				in0, e0 := ms[0].EstimateAt(nextReport)
				in1, e1 := ms[1].EstimateAt(nextReport)
				ms[0].SetFleetOthers(FleetOthersWithAuto(fleet, local, in0, e0, in1, e1))
				ms[1].SetFleetOthers(in0, e0)
			}
			k := int(next[i] / W)
			if k >= windows {
				break
			}
			offered[i][k]++
			if ms[i].Packet(now).Verdict == VerdictPass {
				passed[i][k]++
			}
			next[i] += W / rates[i]
		}
		for k := 2; k < windows; k++ {
			o0, o1 := offered[0][k], offered[1][k]
			rf := float64(o0 + o1)
			share := fleet.Expected(uint64(rf)).Passed / rf
			for i, want := range []float64{local.Expected(uint64(o0)).Passed, float64(o1) * share} {
				o := []int{o0, o1}[i]
				sigma := math.Sqrt(want * (1 - want/float64(o)))
				if math.Abs(float64(passed[i][k])-want) > 5*sigma+0.03*want {
					t.Errorf("seed %d window %d: member %d offered %d passed %d, want %.0f ± (5 × %.1f + 3%%); member 0's fleet share %.0f",
						seed, k, i, o, passed[i][k], want, sigma, float64(o0)*share)
				}
			}
		}
	}
}
