package main

// Issue 42's sections of results.md: how BPF_PROG_TEST_RUN is timed on
// this host (BenchmarkTiming, bpf/bench_chunks_test.go), and tierlimit
// beside its peers (BenchmarkPeers, bpf/bench_peers_test.go).

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tierlimit/tierlimit/internal/mitigation"
)

// peerRows are BenchmarkPeers' programs in the order of issue 42's table,
// with their titles; tierlimit's paths are marked.
var peerRows = []struct {
	name, title string
	tierlimit   bool
	peer        bool
}{
	{"bare", "bare XDP_PASS", false, false},
	{"floor", "floor: one atomic add (the exact window count, §2)", false, false},
	{"xdp-filter-udp", "xdp-filter, UDP ports only (allow mode, one port listed)", false, true},
	{"smooth-pass", "**tierlimit, selected, pass (smooth)**", true, false},
	{"ordinal-pass", "tierlimit, selected, pass (ordinal)", true, false},
	{"drop", "tierlimit, selected, drop", true, false},
	{"budgets-pass", "tierlimit, per-source budgets, pass (smooth)", true, false},
	{"xdp-filter-all", "xdp-filter, all features", false, true},
	{"xdp-firewall", "XDP-Firewall (gamemann), pass", false, true},
	{"l3af-syn", "L3AF ratelimiting, TCP SYN", false, true},
}

// rateLimiters are the peers issue 42 sets the 2.5 × target against.
var rateLimiters = []string{"xdp-firewall", "l3af-syn"}

const peersBench, timingBench = "BenchmarkPeers", "BenchmarkTiming"

// timing is BenchmarkTiming's figure unit (its median over the runs).
func (r *report) timing(unit string) stat { return statOf(values(r.bench, timingBench, unit)) }

// chunkText says how figures 1-3's chunks are sized, for their sections.
func (r *report) chunkText() string {
	c := r.timing("chunk")
	if c.n == 0 {
		return "in chunks sized to the host's tick (section *Timing*)"
	}
	return fmt.Sprintf("in chunks of %.0f packets (median over the runs; %s ticks of %.2f ms of the bare program, section *Timing*), at least two per program", c.med, r.timing("ticks").f(0), r.timing("quantum-ms").med)
}

// hostSection writes the host's CPU, its vulnerability report, the kernel
// and how BPF_PROG_TEST_RUN was timed on it.
func (r *report) hostSection(p func(string, ...any)) {
	p("## Host and timing")
	p("")
	p("CPU **%s**, kernel **%s**. The CPU's vulnerability report (`/sys/devices/system/cpu/vulnerabilities`, every file):", r.env.cpu, r.env.kernel)
	p("")
	rep, err := mitigation.Read("/")
	if err != nil {
		p("- not read: %v", err)
	}
	for _, e := range rep {
		p("- `%s`: %s", e.Name, e.Status)
	}
	p("")
	if err == nil {
		p("What costs the program per call here (`tierlimit check` prints the same): %s.", rep.Summary())
		p("")
	}
	if r.timing("chunk").n == 0 {
		return
	}
	q, fixed, hz := r.timing("quantum-ms"), r.timing("fixed-ms"), r.timing("config-hz")
	p("**Timing** (`BenchmarkTiming`, bpf/bench_chunks_test.go). A BPF_PROG_TEST_RUN call of more than one packet of an XDP program pays a fixed cost that ends on a kernel tick (the kernel swaps the program into the XDP dispatcher around its loop, and each swap waits for an RCU grace period), so a call's wall time moves in steps of a tick: with chunks of 131,072 packets every figure was a multiple of 30.5 ns. The harness measures the step: 64 calls of 1,024 packets, each after a random pause, whose ends fall on a grid; the quantum is the grid's step (the largest step whose phase coherence over the gaps between the calls' ends is at least 0.75 of the best). On a loaded machine the grid can be a fraction of the tick (2.0 ms at HZ=250 has been measured while other jobs ran; likely the ticks of the two CPUs, half a tick apart), so the chunk spans its ticks of the coarser of the quantum and 1/CONFIG_HZ.")
	p("")
	p("| | measured (median [min, max] over the runs) |")
	p("|---|---|")
	p("| quantum of a call's wall time (the tick) | %s ms |", q.f(3))
	p("| CONFIG_HZ (/proc/config.gz; stated, not used) | %s |", hz.f(0))
	p("| a call's least fixed cost (1,024 packets) | %s ms, subtracted from every chunk's wall time |", fixed.f(2))
	p("| bare XDP_DROP, ns per packet (what the chunk is sized from) | %s |", r.timing("bare-ns").f(2))
	p("| chunk: packets per BPF_PROG_TEST_RUN call | %s (%s of the coarser of the quantum and CONFIG_HZ's tick, of the bare program; a step of one quantum is ≤ 1/%s of any figure) |", r.timing("chunk").f(0), r.timing("ticks").f(0), r.timing("ticks").f(0))
	p("| kernel run-time statistics (BPF_ENABLE_STATS fd): their own cost per run, the bare program's counted run time | %s ns |", r.timing("stats-fixed-ns").f(1))
	p("| what the statistics add to a run's wall time | %s ns |", r.timing("stats-wall-ns").f(1))
	p("")
}

// peersSection writes issue 42's table: each program's ns per packet and
// × bare, and each peer's × over each tierlimit path, within each run.
func (r *report) peersSection(p func(string, ...any)) {
	if len(values(r.bench, peersBench, "bare-ns")) == 0 {
		return
	}
	p("## 6. tierlimit beside its peers (issue 42)")
	p("")
	p("`BenchmarkPeers` (bpf/bench_peers_test.go): every program below runs in one benchmark, chunk by chunk in turn, %s, the call's fixed cost subtracted, each on its frame: the UDP syslog datagram to 514 (`testenv.UDP4`), for L3AF a TCP SYN to port 80 (its path). Each is checked for its verdict on its frame first. tierlimit runs as the agent does (tick gate on), its window open; drop is a saturated window. The peers are built by `deploy/bench/peers.sh` from their public sources at pinned commits, with clang-19, out of tree, and set up in Go as their loaders would for their normal pass path (bpf/bench_peers_setup_test.go): xdp-filter with one UDP port listed (9999), XDP-Firewall with one rule (drop UDP to ports from 9999; its flow statistics on, as committed), L3AF with port 80 at a rate it never reaches. ns is each program's fastest chunk; *own ns* is the run time the kernel's statistics count per run less the bare program's (their own cost per run, %s ns, subtracted from both sides). Median [min, max] over %d runs.", r.chunkText(), r.timing("stats-fixed-ns").f(1), r.opts.count)
	p("")
	if r.peersFrom != "" {
		p("Peers from `%s`:", r.peersFrom)
		for _, l := range r.peerSources {
			p("- %s", l)
		}
		p("")
	}
	p("| program | ns/packet | × bare | own ns (stats) |")
	p("|---|---|---|---|")
	var missing []string
	for _, row := range peerRows {
		v := values(r.bench, peersBench, row.name+"-ns")
		if len(v) == 0 {
			if row.peer {
				missing = append(missing, row.title)
			}
			continue
		}
		p("| %s | %s | %s× | %s |", row.title, statOf(v).f(1), statOf(values(r.bench, peersBench, row.name+"-x-bare")).f(2), statOf(values(r.bench, peersBench, row.name+"-own-ns")).f(1))
	}
	p("")
	if len(missing) > 0 {
		p("**Not measured** (no object: run `deploy/bench/peers.sh` and pass its directory as `PEERS_DIR`): %s. Without them the comparison is with the floor above, the least any program with the exact window count does per selected packet.", strings.Join(missing, "; "))
		p("")
	}
	r.peerRatios(p)
	r.profileText(p)
}

// peerRatios writes each peer's (and the floor's) × over each tierlimit
// path, within each run: by wall ns, and by own ns.
func (r *report) peerRatios(p func(string, ...any)) {
	var paths, others []string
	for _, row := range peerRows {
		if len(values(r.bench, peersBench, row.name+"-ns")) == 0 {
			continue
		}
		if row.tierlimit {
			paths = append(paths, row.name)
		} else if row.name != "bare" {
			others = append(others, row.name)
		}
	}
	if len(paths) == 0 || len(others) == 0 {
		return
	}
	p("**× of each peer over each tierlimit path** (peer ns / tierlimit ns within each run; in parentheses the same of own ns, the statistics' cost and the empty program's taken off both sides). Above 1: tierlimit is faster. Issue 42's target is ≥ 2.5 × over XDP-Firewall and L3AF on every path.")
	p("")
	p("| peer | %s |", strings.Join(paths, " | "))
	p("|---|%s", strings.Repeat("---|", len(paths)))
	for _, o := range others {
		row := []string{o}
		for _, t := range paths {
			wall := derived(r.bench, peersBench, func(m map[string]float64) float64 { return metric(m, o+"-ns") / metric(m, t+"-ns") })
			own := derived(r.bench, peersBench, func(m map[string]float64) float64 { return metric(m, o+"-own-ns") / metric(m, t+"-own-ns") })
			cell := statOf(wall).f(2) + "× (" + statOf(own).f(2) + "×)"
			if slices.Contains(rateLimiters, o) {
				cell += " " + yes(statOf(wall).n > 0 && statOf(wall).med >= 2.5)
			}
			row = append(row, cell)
		}
		p("| %s |", strings.Join(row, " | "))
	}
	p("")
}

// profileText writes bpftool's profile of the selected paths, or why it
// did not run (the benchmark's log line, profileLog there).
func (r *report) profileText(p func(string, ...any)) {
	r.sampledText(p)
	if r.profileLine != "" && len(values(r.bench, peersBench, "smooth-pass-cycles")) == 0 {
		p("**bpftool prog profile** (cycles, instructions, iTLB misses of the selected paths): %s", r.profileLine)
		p("")
		return
	}
	if len(values(r.bench, peersBench, "smooth-pass-cycles")) == 0 {
		return
	}
	p("**bpftool prog profile** of the selected paths (each pinned in a bpffs directory of its own and profiled for 2 s while BPF_PROG_TEST_RUN drives it), per run:")
	p("")
	p("| path | cycles | instructions | iTLB misses |")
	p("|---|---|---|---|")
	for _, path := range []string{"smooth-pass", "ordinal-pass", "drop", "budgets-pass"} {
		p("| %s | %s | %s | %s |", path, statOf(values(r.bench, peersBench, path+"-cycles")).f(0),
			statOf(values(r.bench, peersBench, path+"-insns")).f(0), statOf(values(r.bench, peersBench, path+"-itlb")).f(3))
	}
	p("")
}

// sampledText writes the sampled profile's lines (bpf/bench_lines_test.go):
// each selected path's costliest source lines, by share of the program's
// samples of the software clock.
func (r *report) sampledText(p func(string, ...any)) {
	if len(r.sampleLines) == 0 {
		return
	}
	p("**Sampled profile** of the selected paths (the software clock every 10 µs on the thread that drives BPF_PROG_TEST_RUN, 3 s a path; each sample in the program given to the source line of the instruction before it, by the JIT's line info; the costliest lines, as shares of the program's samples, last run):")
	p("")
	for _, l := range r.sampleLines {
		p("- %s", l)
	}
	p("")
}

// sampledLines finds BenchmarkPeers' log lines of the sampled profile in
// the benchmarks' output: the last run's, one a path.
func sampledLines(out []byte) []string {
	byPath := map[string]string{}
	var order []string
	for _, after := range markedLines(out, "sampled profile: ") {
		path, _, _ := strings.Cut(after, ":")
		if _, seen := byPath[path]; !seen {
			order = append(order, path)
		}
		byPath[path] = after
	}
	ls := make([]string, 0, len(order))
	for _, path := range order {
		ls = append(ls, byPath[path])
	}
	return ls
}

// markedLines is what follows marker on each line of out that holds it,
// in order.
func markedLines(out []byte, marker string) []string {
	var ls []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), marker); ok {
			ls = append(ls, after)
		}
	}
	return ls
}

// profileReason finds BenchmarkPeers' log line about bpftool's profile in
// the benchmarks' output.
func profileReason(out []byte) string {
	if ls := markedLines(out, "bpftool prog profile: "); len(ls) > 0 {
		return ls[0]
	}
	return ""
}

// readPeerSources reads peers.sh's peers.txt in dir: each object and its
// source at its commit.
func readPeerSources(dir string) []string {
	b, err := os.ReadFile(filepath.Join(dir, "peers.txt"))
	if err != nil {
		return []string{fmt.Sprintf("(no peers.txt: %v)", err)}
	}
	var ls []string
	for l := range strings.Lines(string(b)) {
		if l = strings.TrimSpace(l); l != "" {
			ls = append(ls, "`"+l+"`")
		}
	}
	return ls
}

// peerTargets are issue 42's rows of the targets table: ns per packet of
// the selected paths, and the × over the rate-limiting peers.
func (r *report) peerTargets(p func(string, ...any)) {
	if len(values(r.bench, peersBench, "bare-ns")) == 0 {
		return
	}
	for _, t := range []struct {
		path string
		max  float64
	}{{"smooth-pass", 60}, {"drop", 55}, {"budgets-pass", 70}} {
		s := statOf(values(r.bench, peersBench, t.path+"-ns"))
		p("| BenchmarkPeers %s ≤ %.0f ns (issue 42; on issue 42's AMD EPYC with Safe RET) | %s ns (%s× bare) | %s |", t.path, t.max, s.f(1),
			statOf(values(r.bench, peersBench, t.path+"-x-bare")).f(2), yes(s.n > 0 && s.med <= t.max))
	}
	for _, o := range rateLimiters {
		if len(values(r.bench, peersBench, o+"-ns")) == 0 {
			p("| every tierlimit path ≥ 2.5× faster than %s (issue 42) | not measured (no PEERS_DIR): see section 6 | — |", o)
			continue
		}
		worst := math.Inf(1)
		for _, t := range []string{"smooth-pass", "ordinal-pass", "drop", "budgets-pass"} {
			x := statOf(derived(r.bench, peersBench, func(m map[string]float64) float64 { return metric(m, o+"-ns") / metric(m, t+"-ns") }))
			if x.n > 0 {
				worst = min(worst, x.med)
			}
		}
		p("| every tierlimit path ≥ 2.5× faster than %s (issue 42) | the slowest path: %.2f× | %s |", o, worst, yes(worst >= 2.5))
	}
}
