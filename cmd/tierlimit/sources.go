package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/tiers"
)

// Per-source budgets in status and check (docs/design.md §6).

// sourcesJSON is the status --json --top shape.
type sourcesJSON struct {
	BudgetPackets uint32            `json:"budget_packets"`
	PrefixV4      uint8             `json:"prefix_v4"`
	PrefixV6      uint8             `json:"prefix_v6"`
	OverBudget    map[string]uint64 `json:"over_budget_packets"`
	OverRecently  int               `json:"groups_over_budget_recently"`
	Top           []groupJSON       `json:"top"`
}

type groupJSON struct {
	Group      string `json:"group"`
	Packets    uint64 `json:"over_budget_packets"`
	LastWindow uint64 `json:"last_window"`
	Windows    uint64 `json:"windows_over"`
}

func sourcesToJSON(s *agent.Sources) *sourcesJSON {
	if s == nil {
		return nil
	}
	out := &sourcesJSON{BudgetPackets: s.Budget.Budget, PrefixV4: s.Budget.PrefixV4, PrefixV6: s.Budget.PrefixV6,
		OverBudget: map[string]uint64{}, OverRecently: s.OverRecently, Top: []groupJSON{}}
	for _, v := range tiers.Verdicts {
		out.OverBudget[v.String()] = s.OverBudget[v].Packets
	}
	for _, g := range s.Top {
		out.Top = append(out.Top, groupJSON{Group: g.Group.String(), Packets: g.Packets, LastWindow: g.LastWindow, Windows: g.Windows})
	}
	return out
}

// writeSources prints the budget and the heaviest groups over budget; nil
// prints nothing.
func writeSources(w io.Writer, s *agent.Sources) error {
	if s == nil {
		return nil
	}
	fmt.Fprintln(w)
	if s.Budget.Budget == 0 {
		fmt.Fprintln(w, "sources: off")
	} else {
		fmt.Fprintf(w, "sources: %s\n", s.Budget)
	}
	fmt.Fprintf(w, "over budget: %d dropped, %d would_drop, %d passed (mode off); %d groups over in the current or previous window\n",
		s.OverBudget[tiers.VerdictDrop].Packets, s.OverBudget[tiers.VerdictWouldDrop].Packets,
		s.OverBudget[tiers.VerdictPass].Packets, s.OverRecently)
	if len(s.Top) == 0 {
		fmt.Fprintln(w, "no source group has gone over budget")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "group\tover budget\tlast window\twindows over")
	for _, g := range s.Top {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", g.Group, g.Packets, g.LastWindow, g.Windows)
	}
	return tw.Flush()
}

// printSourcesCheck prints what check says of a policy's sources: the
// compiled budget, the sketch's memory and its false-positive bound.
func printSourcesCheck(w io.Writer, p tiers.Policy, t tiers.Table) {
	if !p.Sources.Enabled() {
		fmt.Fprintln(w, "\nsources: off (no per-source budget)")
		return
	}
	b := t.Sources
	fmt.Fprintf(w, "\nsources: budget %s = %d %s per window for each /%d (IPv4) or /%d (IPv6) source group\n",
		p.Sources, b.Budget, p.Count.Unit(), b.PrefixV4, b.PrefixV6)
	if p.Fleet != nil {
		printFleetSources(w, p)
	}
	printSharing(w, p, t)
	fmt.Fprintf(w, "  count-min sketch: %d rows × %d columns of %d-byte cells = %s, whatever the number of sources;\n",
		tiers.SketchRows, tiers.SketchCols, tiers.SketchCellBytes, binarySize(tiers.SketchBytes))
	fmt.Fprintf(w, "  groups over budget table: %d entries (LRU, counted per CPU: a flood from one source shares no cache line)\n", tiers.TopSources)
	fmt.Fprintln(w, "  the sketch never underestimates; a light group is judged over budget only when all of its")
	fmt.Fprintf(w, "  %d cells collide with heavy groups: P ≈ (1-(1-1/%d)^h)^%d, at most (h/%d)^%d (pairwise-independent rows)\n",
		tiers.SketchRows, tiers.SketchCols, tiers.SketchRows, tiers.SketchCols, tiers.SketchRows)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  heavy groups h\tP(light group misjudged)\tbound\t")
	for _, h := range []int{10, 100, 1000, 10000} {
		p, u := tiers.SketchFalsePositive(h)
		fmt.Fprintf(tw, "  %d\t%.3g\t%.3g\t\n", h, p, u)
	}
	tw.Flush()
}

// printFleetSources states budgets in a fleet (docs/design.md §12): per
// member, a percent of the member's own max, never of fleet.max; the
// others' reports taken as in-budget load; the member's report of all its
// packets.
func printFleetSources(w io.Writer, p tiers.Policy) {
	f := p.Fleet
	if p.Sources.BudgetPackets == 0 {
		of := fmt.Sprintf("this member's own max %d", p.Max)
		if p.Auto != nil {
			of = "this member's learnt max (max: auto)"
		}
		fmt.Fprintf(w, "  in fleet %s the budget is per member: %s of %s, not of fleet.max %d", f.Name, p.Sources, of, f.Max)
		if f.Fallback == tiers.FallbackShare {
			fmt.Fprintf(w, "; in fallback share, of fleet.max ÷ the members (%d packets with 3 members)",
				mustCompileSources(p.FleetFallbackPolicy(3)))
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "  in fleet %s the budget is per member: %s packets per group on each member\n", f.Name, p.Sources)
	}
	fmt.Fprintln(w, "  each member reports R̂_in (its in-budget packets) and R̂_tot (all its packets); in-budget packets are judged at")
	fmt.Fprintln(w, "  q(R̂_in + others_in), over-budget packets share P(R̂_tot + others_tot) − P(R̂_in + others_in), so the fleet passes")
	fmt.Fprintln(w, "  P(R_fleet) as without budgets, and light groups lose nothing to a noisy group on any member")
}

// mustCompileSources is the budget in packets of a valid policy p, 0 if
// it does not compile.
func mustCompileSources(p tiers.Policy) uint32 {
	t, err := tiers.Compile(p, 0)
	if err != nil {
		return 0
	}
	return t.Sources.Budget
}

// printSharing states how budgets share (docs/design.md §6): the rule, how the
// shape applies it, and for the ordinal shape the bound on what the
// collector can receive beyond P(R) in a window.
func printSharing(w io.Writer, p tiers.Policy, t tiers.Table) {
	fmt.Fprintln(w, "  sharing: a group's packets beyond its budget are over budget and not counted in n; in-budget packets are judged as")
	fmt.Fprintln(w, "  if there were none over budget (P(R_in) pass), and over-budget packets on the capacity in-budget traffic leaves, so together")
	fmt.Fprintln(w, "  they pass P(R_in + R_ex) − P(R_in) and the window passes P(R_in + R_ex), as without budgets: a source alone (a relay)")
	fmt.Fprintln(w, "  gets what the tiers give it, and light groups lose nothing to a noisy one")
	if p.Shape == tiers.ShapeSmooth {
		fmt.Fprintln(w, "  smooth: each over-budget packet passes with probability (P(R̂_in + R̂_ex) − P(R̂_in)) / R̂_ex, from the estimates of the")
		fmt.Fprintln(w, "  in-budget and over-budget counts, recomputed once per tick; the collector receives no more than without budgets, in expectation")
		return
	}
	fmt.Fprintln(w, "  ordinal: an over-budget packet is judged at position max(n, expect_in) + its rank among the window's over-budget packets,")
	fmt.Fprintln(w, "  expect_in the previous window's in-budget count less the gap's share; in steady state the over-budget positions start")
	fmt.Fprintln(w, "  after the previous window's in-budget count")
	fmt.Fprintln(w, "  bound: a window with no previous window (expect_in = 0) whose over-budget traffic arrives before its in-budget traffic")
	fmt.Fprintf(w, "  can pass up to T_1 = %d packets more than P(R_in + R_ex): in-budget and over-budget packets both take tier 0's positions\n", t.Bounds[0])
}

// binarySize writes n bytes in the largest binary unit that divides it:
// "2 MiB", "256 KiB", "100 B".
func binarySize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
