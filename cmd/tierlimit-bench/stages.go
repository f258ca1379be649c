package main

// Figure 1's stage table: where the cost of each main path goes, from
// BenchmarkStages (bpf/bench_stages_test.go).

import (
	"slices"
	"strings"
)

// stagePaths are BenchmarkStages' sub-benchmarks, with the stages each
// reaches in order (their metrics are <stage>-ns), the whole program last.
var stagePaths = []struct {
	path   string
	stages []string
}{
	{"selected-drop", []string{"entry", "parsed", "judge", "policy", "window", "full"}},
	{"selected-pass", []string{"entry", "parsed", "judge", "policy", "window", "full"}},
	{"sources-pass", []string{"entry", "parsed", "judge", "policy", "group", "sketch", "window", "full"}},
	{"sources-over", []string{"entry", "parsed", "judge", "policy", "group", "sketch", "full"}},
}

// stageColumns are the table's columns: what each stage adds to the one
// before it ("entry" adds to bare).
var stageColumns = []struct{ stage, title string }{
	{"entry", "entry (test run)"},
	{"parsed", "parse Ethernet–UDP"},
	{"judge", "call tl_judge"},
	{"policy", "settings, selectors, exempt"},
	{"group", "source group, window id"},
	{"sketch", "sketch (hash, rows)"},
	{"window", "window count"},
	{"full", "tier, verdict, stats (top table)"},
}

// stageTable writes the stage table when the run has BenchmarkStages.
func (r *report) stageTable(p func(string, ...any)) {
	if len(values(r.bench, "BenchmarkStages/selected-drop", "full-ns")) == 0 {
		return
	}
	p("**Where the cost goes.** `BenchmarkStages` (bpf/bench_stages_test.go) loads the program once per stage with limiter.c's `tl_bench_stage` set, so that every packet returns XDP_DROP at that stage (`TL_STAGE`; in every other load the constant is 0 and the verifier removes the checks), and once whole, all on one set of maps so that the window is open as in traffic; each runs chunk by chunk beside a bare XDP_DROP on the same frame, fastest chunk. A cell is what a stage adds to the one before it, in ns per packet, within each run (median [min, max]); — is a stage the path does not reach.")
	p("")
	head := []string{"path", "bare"}
	for _, c := range stageColumns {
		head = append(head, c.title)
	}
	head = append(head, "whole program", "× bare")
	p("| %s |", strings.Join(head, " | "))
	p("|%s", strings.Repeat("---|", len(head)))
	for _, sp := range stagePaths {
		n := "BenchmarkStages/" + sp.path
		row := []string{sp.path, statOf(values(r.bench, n, "bare-ns")).f(1)}
		for _, c := range stageColumns {
			i := slices.Index(sp.stages, c.stage)
			if i < 0 {
				row = append(row, "—")
				continue
			}
			prev := "bare-ns"
			if i > 0 {
				prev = sp.stages[i-1] + "-ns"
			}
			cur := c.stage + "-ns"
			row = append(row, statOf(derived(r.bench, n, func(m map[string]float64) float64 { return metric(m, cur) - metric(m, prev) })).f(1))
		}
		row = append(row, statOf(values(r.bench, n, "full-ns")).f(1),
			statOf(derived(r.bench, n, func(m map[string]float64) float64 { return metric(m, "full-ns") / metric(m, "bare-ns") })).f(2)+"×")
		p("| %s |", strings.Join(row, " | "))
	}
	p("")
}
