package main

// Figure 1's floors and the per-source budgets' rows (issue 12): what
// tierlimit's cost is made of beside the atomic adds that docs/design.md's exact
// semantics require, and the live-frames figure with sources on.

import "math"

// programPaths are BenchmarkProgram's paths in the order figure 1 lists
// them.
var programPaths = []string{
	"selected-pass", "selected-random", "selected-drop", "unselected",
	"selected-pass-severity", "selected-drop-severity",
	"sources-pass", "sources-pass-ipv6", "sources-over",
}

// floorPaths are the paths that BenchmarkProgram measures beside a floor
// program: those whose packets make atomic adds that the semantics require.
var floorPaths = []string{"selected-pass", "selected-random", "selected-pass-severity", "sources-pass", "sources-pass-ipv6"}

// liveSourcesCases are BenchmarkLiveFramesSources's sub-benchmarks.
var liveSourcesCases = []string{"over-budget", "within-budget"}

// derived is f of the metrics of every run of benchmark name, leaving out
// the runs where f is NaN or infinite (a metric missing).
func derived(rs []benchResult, name string, f func(m map[string]float64) float64) []float64 {
	var v []float64
	for _, r := range rs {
		if r.name != name {
			continue
		}
		if x := f(r.metrics); !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	return v
}

// metric is m[unit], NaN when m lacks it.
func metric(m map[string]float64, unit string) float64 {
	if x, ok := m[unit]; ok {
		return x
	}
	return math.NaN()
}

// floorTable is figure 1's second table: each floor program beside bare
// and tierlimit, and the share of tierlimit's cost above bare that the
// floor's atomic adds account for.
func (r *report) floorTable(p func(string, ...any)) {
	if len(values(r.bench, "BenchmarkProgram/gate/selected-pass", "floor-ns/pkt")) == 0 {
		return
	}
	p("**Floors.** docs/design.md's exact semantics make some atomic adds unavoidable: every selected packet below T_last adds 1 to the window's shared count (§2, exact n), and with per-source budgets (§6) a packet within its group's budget also adds 1 to one cell in each of the count-min sketch's rows. On those paths a third program runs in the same alternation as bare, on the same frame: the *floor* (`testenv.AtomicFloorProgram`), a bare XDP_DROP that looks up that many array cells, each on its own cache line, and makes one 64-bit atomic add to each, and does nothing else. It is what any program with these semantics costs under this test run, at the least; *tierlimit − floor* is the program's own work (parse, policy and selector lookups, the window's gate, tier table, draws, hashing, stats), and *floor's share* is (floor − bare) / (tierlimit − bare) within each run. The other paths make no atomic add that the semantics require, so their floor is bare: the saturated window's fast path (selected-drop) counts in its CPU's overflow slot, and an over-budget group's sketch cells are only read, and its entry in the table of groups over budget is per CPU (plain adds).")
	p("")
	p("| path | atomic adds | floor ns/pkt | floor × bare | tierlimit × floor | tierlimit − floor ns | floor's share of tierlimit − bare |")
	p("|---|---|---|---|---|---|---|")
	for _, mode := range []string{"gate", "exact"} {
		for _, path := range floorPaths {
			n := "BenchmarkProgram/" + mode + "/" + path
			own := derived(r.bench, n, func(m map[string]float64) float64 { return metric(m, "ns/pkt") - metric(m, "floor-ns/pkt") })
			share := derived(r.bench, n, func(m map[string]float64) float64 {
				return 100 * (metric(m, "floor-ns/pkt") - metric(m, "bare-ns/pkt")) / (metric(m, "ns/pkt") - metric(m, "bare-ns/pkt"))
			})
			p("| %s/%s | %s | %s | %s× | %s× | %s | %s%% |", mode, path, statOf(values(r.bench, n, "floor-atomics")).f(0),
				statOf(values(r.bench, n, "floor-ns/pkt")).f(1), statOf(values(r.bench, n, "floor-x-bare")).f(2),
				statOf(values(r.bench, n, "x-floor")).f(2), statOf(own).f(1), statOf(share).f(0))
		}
	}
	p("")
	p("x86's locked adds are full barriers and do not overlap, so a floor grows about linearly with its adds.")
	p("")
}

// liveSources is figure 2's rows for BenchmarkLiveFramesSources.
func (r *report) liveSources(p func(string, ...any)) {
	if len(values(r.bench, "BenchmarkLiveFramesSources/over-budget", "Mpps")) == 0 {
		return
	}
	p("**With per-source budgets** (docs/design.md §6; `BenchmarkLiveFramesSources`, bpf/bench_sources_test.go, the same live-frames runs beside a bare XDP_DROP, chunk by chunk; each figure the fastest chunk's): *over-budget* is one source group far over its budget, dropped after the sketch's plain reads (no atomic adds) and the top table's update; *within-budget* is every packet within its group's budget (a budget of 10^9), so it makes the sketch's atomic adds, then the saturated window's 100%% tier drops it, as in a spoofed flood of many small groups.")
	p("")
	p("| sources | tierlimit Mpps (1 CPU) | bare XDP_DROP Mpps | ratio tierlimit / bare |")
	p("|---|---|---|---|")
	for _, c := range liveSourcesCases {
		n := "BenchmarkLiveFramesSources/" + c
		p("| %s | %s | %s | %s× |", c, statOf(values(r.bench, n, "Mpps")).f(2), statOf(values(r.bench, n, "bare-Mpps")).f(2), statOf(values(r.bench, n, "x-bare")).f(2))
	}
	p("")
}

// sourcesTargets are issue 12's rows of the targets table.
func (r *report) sourcesTargets(p func(string, ...any)) {
	const sp, pass = "BenchmarkProgram/gate/sources-pass", "BenchmarkProgram/gate/selected-pass"
	src := statOf(values(r.bench, sp, "x-bare"))
	p("| test_run, selected path with sources on ≤ 2.6× bare XDP_DROP (issue 12; sources-pass) | %s× (its floor of %s atomic adds: %s×) | %s |",
		src.f(2), statOf(values(r.bench, sp, "floor-atomics")).f(0), statOf(values(r.bench, sp, "floor-x-bare")).f(2), yes(src.n > 0 && src.med <= 2.6))
	abs := statOf(values(r.bench, pass, "x-bare"))
	p("| test_run, selected path with sources absent ≤ 2.0× bare XDP_DROP (issue 12; selected-pass) | %s× (its floor of 1 atomic add: %s×) | %s |",
		abs.f(2), statOf(values(r.bench, pass, "floor-x-bare")).f(2), yes(abs.n > 0 && abs.med <= 2))
	const lv = "BenchmarkLiveFramesSources/"
	p("| live frames with sources on (issue 12) | over budget %s× bare (%s Mpps), within budget %s× (%s Mpps) | reported |",
		statOf(values(r.bench, lv+"over-budget", "x-bare")).f(2), statOf(values(r.bench, lv+"over-budget", "Mpps")).f(2),
		statOf(values(r.bench, lv+"within-budget", "x-bare")).f(2), statOf(values(r.bench, lv+"within-budget", "Mpps")).f(2))
}
