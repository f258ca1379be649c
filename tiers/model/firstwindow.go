package model

import (
	"math/rand/v2"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// FleetStep runs one flood on f's members: each offered base/members
// packets per window, evenly spaced from a random phase, from 2 windows
// before stepNs (none when base is 0), then flood/members from stepNs on,
// again from a random phase; every member reports at a random phase. It
// returns what the fleet passed in [stepNs, stepNs + window).
func FleetStep(f *FleetModel, window time.Duration, base, flood float64, stepNs uint64, rng *rand.Rand) int {
	members := len(f.members)
	W := float64(window)
	for i := range members {
		f.SetReportPhase(i, rng.Uint64N(f.report))
	}
	step, end := float64(stepNs), float64(stepNs)+W
	next := make([]float64, members)
	for i := range next {
		next[i] = step + rng.Float64()*W*float64(members)/flood
		if base > 0 {
			next[i] = step - 2*W + rng.Float64()*W*float64(members)/base
		}
	}
	passed := 0
	for {
		i := 0
		for j := range next {
			if next[j] < next[i] {
				i = j
			}
		}
		at := next[i]
		if at >= end {
			return passed
		}
		d := f.Packet(i, uint64(at))
		rate := flood
		if at < step {
			rate = base
		}
		if at >= step && d.Verdict == tiers.VerdictPass {
			passed++
		}
		nx := at + W*float64(members)/rate
		if at < step && nx >= step {
			// The flood's first packet on this member, at a random phase
			// of its own spacing from the step.
			nx = step + rng.Float64()*W*float64(members)/flood
		}
		next[i] = nx
	}
}

// FleetFirstWindow returns the first window-long span's passes from a
// flood that reaches every member of a fleet at once (docs/design.md §12,
// "The fleet's first second"), over runs runs, as multiples of
// P(flood) on t: their mean and the most of one run. members members of
// policy p (compiled as t) share flood packets per window equally, from
// base (0: idle) at a random phase of the window, the tick and each
// member's reports (FleetStep). tierlimit check prints it for 3 and 30
// members.
func FleetFirstWindow(p tiers.Policy, t tiers.Table, members int, base, flood float64, runs int, seed uint64) (mean, worst float64) {
	want := t.Expected(uint64(flood)).Passed
	if want == 0 || runs <= 0 {
		return 0, 0
	}
	for k := range uint64(runs) {
		rng := rand.New(rand.NewPCG(seed, k))
		f := NewFleetModel(p, t, members, 0, rng.Uint32)
		step := uint64(3*p.Window) + rng.Uint64N(uint64(p.Window))
		r := float64(FleetStep(f, p.Window, base, flood, step, rng)) / want
		mean += r / float64(runs)
		worst = max(worst, r)
	}
	return mean, worst
}
