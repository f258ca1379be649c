package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// demoChaos is demo --fleet --chaos: member 0, the one with the most load,
// is cut off from the store (lab.cut: a firewall rule in its namespace)
// from the start of window From (0-based) to the start of window To, and
// the demo prints the fleet's total beside docs/design.md §12's bound for
// the policy's fallback (tiers.FleetPartitionBound).
type demoChaos struct {
	From, To int
}

// chaosWindows is where the cut falls in n windows: from the second to
// the second last but one, at least one window.
func chaosWindows(n int) demoChaos {
	return demoChaos{From: 1, To: max(n-1, 2)}
}

// runChaos cuts member 0 off at window c.From and joins it again at c.To,
// the windows starting at t0, window apart; it returns when done or when
// stop closes, with the member joined again either way.
func (c demoChaos) run(lab *fleetLab, t0 time.Time, window time.Duration, stop <-chan struct{}) error {
	wait := func(k int) bool {
		select {
		case <-time.After(time.Until(t0.Add(time.Duration(k) * window))):
			return true
		case <-stop:
			return false
		}
	}
	if !wait(c.From) {
		return nil
	}
	if err := lab.cut(0, true); err != nil {
		return err
	}
	wait(c.To)
	return lab.cut(0, false)
}

// printChaos writes the table of the windows with the cut: each member's
// passed and offered, the fleet's, whether member 0 was cut off, and the
// bound the fleet's total keeps: P(R_fleet) while every member reaches
// the store, (1 + k) × C_M at worst in the cut's first ttl, and the
// fallback's bound after it.
func (m fleetDemoModel) printChaos(out io.Writer, lab *fleetLab, pol tiers.Policy, loads []float64, sent [][]int, c demoChaos, window time.Duration) error {
	w := demoFleetWeights(len(lab.members))
	share := float64(w[0]) / float64(sumOf(w))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	head := "window\tload\t"
	for i := range lab.members {
		head += fmt.Sprintf("m%d passed/offered\t", i)
	}
	fmt.Fprintln(tw, head+"store\tfleet offered\tfleet passed\tbound\t")
	ttlWindows := int((demoFleetTTL + window - 1) / window)
	over := 0
	for k, load := range loads {
		row := fmt.Sprintf("%d\t%g×\t", k+1, load)
		off, pass := 0, 0
		for i := range lab.members {
			p := lab.passed(i, k)
			row += fmt.Sprintf("%d/%d\t", p, sent[i][k])
			off, pass = off+sent[i][k], pass+p
		}
		state, bound := "joined", m.tab.Expected(uint64(off)).Passed
		switch {
		case k >= c.From && k < c.From+ttlWindows && k < c.To:
			state, bound = "m0-cut-ttl", 2*m.tab.Expected(uint64(off)).Passed
		case k >= c.From && k < c.To:
			b, err := tiers.FleetPartitionBound(pol, len(lab.members), []float64{share}, uint64(off))
			if err != nil {
				return err
			}
			state, bound = "m0-cut", b
		}
		if float64(pass) > 1.1*bound {
			over++
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%d\t%.0f\t\n", row, state, off, pass, bound)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nm0 (%.0f %% of the load) is cut off from the store in windows %d..%d (a firewall rule in its namespace). bound: P(R_fleet) while joined;\n"+
		"in the cut's first ttl (%s) the members judge on their last view, (1 + k) × C_M at worst; after it m0 applies fallback %s and the fleet passes at most\n"+
		"the partition bound of docs/design.md §12 (share: (1 + k/N) × C_M; local: C_M + k × C_local; last: (1 + its share) × C_M), C_X the most a table of max X passes.\n",
		100*share, c.From+1, c.To, demoFleetTTL, pol.Fleet.Fallback)
	if over > 0 {
		fmt.Fprintf(out, "%d window(s) passed more than 1.1 × the bound (the demo's pacing and window alignment add noise)\n", over)
	}
	return nil
}
