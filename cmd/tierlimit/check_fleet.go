package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// fleetShares are the shares of the fleet's load one member carries in
// check's fleet table.
var fleetShares = []struct {
	name     string
	num, den uint64
}{{"10 %", 1, 10}, {"50 %", 1, 2}, {"100 %", 1, 1}}

// printFleetCheck prints the fleet (docs/design.md §12), when the policy
// has one: the store, the report and the fallback; then the fleet's pass
// rate at 0.5 to 10 × fleet.max (P(R_fleet) on the table compiled for
// fleet.max) and what one member passes, per window, when it carries 10 %,
// 50 % or 100 % of that load: its share of P(R_fleet), since every member
// passes the same fraction P(R̂_fleet)/R̂_fleet of its offered load.
func printFleetCheck(out io.Writer, p tiers.Policy, t tiers.Table) error {
	f := p.Fleet
	if f == nil {
		return nil
	}
	fmt.Fprintf(out, "\nfleet %s: one budget of fleet.max %d per window across the members with this name and store %s\n", f.Name, f.Max, f.Store)
	fmt.Fprintf(out, "  each member judges on R̂_fleet = its own live R̂ + the others' last reported sum; it reports every %s, and a member not heard from for %s is out\n", f.Report, f.TTL)
	if f.PasswordFile != "" {
		fmt.Fprintf(out, "  password: read from %s at start and on reload\n", f.PasswordFile)
	}
	if f.CAFile != "" {
		fmt.Fprintf(out, "  TLS: the store's certificate is verified against %s\n", f.CAFile)
	}
	switch f.Fallback {
	case tiers.FallbackLocal:
		fmt.Fprintf(out, "  fallback (the store out of reach for %s): local, this policy's max %d\n", f.TTL, p.Max)
	case tiers.FallbackLast:
		fmt.Fprintf(out, "  fallback (the store out of reach for %s): last, this member's last share of fleet.max (own R̂ ÷ R̂_fleet) for %s, then share (%d with 3 members)\n",
			f.TTL, tiers.FleetLastHold*f.TTL, p.FleetFallbackPolicy(3).Max)
	default:
		fmt.Fprintf(out, "  fallback (the store out of reach for %s): share, fleet.max ÷ the members last seen (%d with 3 members)\n", f.TTL, p.FleetFallbackPolicy(3).Max)
	}
	fmt.Fprintf(out, "  with no agent running (killed, pinned), the program applies the fallback alone from %s after its last report\n", f.TTL)
	if p.Auto != nil {
		fmt.Fprintf(out, "  with max: auto, a member never passes more than its learnt max allows on its own R̂\n")
	}
	printFleetOnset(out, p, t)
	fmt.Fprintln(out, "fleet pass rate: the fleet offered R passes P(R); a member carrying a share of R passes that share of P(R)")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(w, "OFFERED\tR\tFLEET P(R)\tPASS RATE\tPASSED\t")
	for _, s := range fleetShares {
		fmt.Fprintf(w, "MEMBER AT %s\t", s.name)
	}
	fmt.Fprintln(w)
	for _, l := range smoothLoads {
		r := f.Max * l.num / l.den
		e := t.Expected(r)
		frac := 0.0
		if r > 0 {
			frac = e.Passed / float64(r)
		}
		fmt.Fprintf(w, "%s\t%d\t%.1f\t%s\t%.2f%%\t", fleetLoadName(l.name), r, e.Passed, perSecond(e.Passed, p.Window), 100*frac)
		for _, s := range fleetShares {
			mine := r * s.num / s.den
			fmt.Fprintf(w, "%.1f of %d\t", frac*float64(mine), mine)
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}

// fleetOnsetMembers are the fleet sizes whose first window check prints.
var fleetOnsetMembers = []int{3, 30}

// fleetOnsetPackets bounds the packets check simulates per fleet size for
// the first window (a few seconds at most): fewer runs for a larger
// fleet.max, none past 400,000.
const fleetOnsetPackets = 4e6

// printFleetOnset prints the fleet's first-window bound (docs/design.md
// §12, "The fleet's first second"): what the fleet model passes in the
// first window-long span of a flood of 10 × fleet.max that reaches 3 and
// 30 members at once from idle, as multiples of P(R_fleet), the mean and
// the most over up to 8 runs at random phases (fleetOnsetPackets); and a warning when report is
// longer than window/10, where the members learn of each other's flood
// too late for the bound.
func printFleetOnset(out io.Writer, p tiers.Policy, t tiers.Table) {
	f := p.Fleet
	if f.Report > p.Window/10 {
		fmt.Fprintf(out, "  warning: fleet.report %s is longer than window/10 (%s): a flood that reaches every member at once passes more than 1.25 × P(R_fleet) in its first window; set fleet.report to at most %s\n",
			f.Report, p.Window/10, p.Window/10)
	}
	flood := 10 * float64(f.Max)
	runs := min(8, int(fleetOnsetPackets/flood))
	if runs == 0 {
		fmt.Fprintf(out, "  first window of a flood reaching every member at once: at most 1.1 × P(R_fleet) on the mean, 1.25 × in a run, with report ≤ window/10 (docs/design.md §12; not simulated here above fleet.max %d)\n", int(fleetOnsetPackets/10))
		return
	}
	fmt.Fprintf(out, "  first window of a flood of 10 × fleet.max reaching every member at once from idle (the fleet model, %d runs; the contract: at most 1.1 × P(R_fleet) on the mean, 1.25 × in a run, with report ≤ window/10):\n", runs)
	for _, n := range fleetOnsetMembers {
		mean, worst := model.FleetFirstWindow(p, t, n, 0, flood, runs, 1)
		fmt.Fprintf(out, "    %d members: %.2f × P(R_fleet) on the mean, %.2f × at most\n", n, mean, worst)
	}
}

// fleetLoadName is a smoothLoads name of max as one of fleet.max.
func fleetLoadName(name string) string {
	const suffix = "max"
	if len(name) >= len(suffix) && name[len(name)-len(suffix):] == suffix {
		return name[:len(name)-len(suffix)] + "fleet.max"
	}
	return name
}
