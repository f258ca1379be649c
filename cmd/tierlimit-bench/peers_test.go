package main

import (
	"fmt"
	"strings"
	"testing"
)

// peersFixture is BenchmarkTiming's and BenchmarkPeers' output with the
// given peers measured.
func peersFixture(withPeers bool) string {
	var b strings.Builder
	b.WriteString("BenchmarkTiming-2 1 8.0 bare-ns 50000000 chunk 250 config-hz 12.5 fixed-ms 4.0 quantum-ms 32.0 stats-fixed-ns 60.0 stats-wall-ns 100 ticks\n")
	ns := map[string]float64{"bare": 10, "floor": 12, "smooth-pass": 40, "ordinal-pass": 30, "drop": 25, "budgets-pass": 50}
	if withPeers {
		for k, v := range map[string]float64{"xdp-filter-udp": 11, "xdp-filter-all": 30, "xdp-firewall": 100, "l3af-syn": 125} {
			ns[k] = v
		}
	}
	for run := 0; run < 1; run++ {
		fmt.Fprintf(&b, "BenchmarkPeers-2 1 32.0 stats-fixed-ns")
		for k, v := range ns {
			fmt.Fprintf(&b, " %.1f %s-ns %.3f %s-x-bare %.1f %s-own-ns", v, k, v/10, k, v-10, k)
		}
		b.WriteString(" 0 ns/op\n")
	}
	b.WriteString("    bench_lines_test.go:250: sampled profile: smooth-pass: 14.0% bpf/window.h:275 `n = add`; 6.0% bpf/verdict.h:41 `st->packets += packets;`\n")
	b.WriteString("    bench_peers_test.go:92: bpftool prog profile: skipped: no hardware PMU on this host\n")
	return b.String()
}

// TestReportPeers renders section 6 and the targets' issue 42 rows from a
// fixture: with the peers, every × of a peer over a path is there; without
// them, the page names the peers not measured.
func TestReportPeers(t *testing.T) {
	for _, with := range []bool{true, false} {
		out := []byte(peersFixture(with))
		r := &report{opts: suiteOpts{count: 1}, bench: parseBench(out), profileLine: profileReason(out), sampleLines: sampledLines(out)}
		var b strings.Builder
		p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
		r.targets(p)
		r.peersSection(p)
		s := b.String()
		if strings.Contains(s, "%!") {
			t.Errorf("a format verb lacks its argument:\n%s", s)
		}
		wants := []string{
			"| **tierlimit, selected, pass (smooth)** | 40.0 | 4.00× | 30.0 |",
			"| BenchmarkPeers smooth-pass ≤ 60 ns (issue 42; on issue 42's AMD EPYC with Safe RET) | 40.0 ns (4.00× bare) | **met** |",
			"**bpftool prog profile** (cycles, instructions, iTLB misses of the selected paths): skipped: no hardware PMU on this host",
			"50000000 packets (median over the runs; 100 ticks of 4.00 ms of the bare program",
			"- smooth-pass: 14.0% bpf/window.h:275 `n = add`; 6.0% bpf/verdict.h:41 `st->packets += packets;`",
		}
		if with {
			wants = append(wants,
				// 100/40 = 2.5 (90/30 own); 125/50 = 2.5 (115/40).
				"| xdp-firewall | 2.50× (3.00×) **met** | 3.33× (4.50×) **met** | 4.00× (6.00×) **met** | 2.00× (2.25×) **not met** |",
				"| l3af-syn | 3.12× (3.83×) **met** | 4.17× (5.75×) **met** | 5.00× (7.67×) **met** | 2.50× (2.88×) **met** |",
				"| every tierlimit path ≥ 2.5× faster than xdp-firewall (issue 42) | the slowest path: 2.00× | **not met** |",
				"| floor | 0.30× (0.07×) |")
		} else {
			wants = append(wants,
				"**Not measured** (no object: run `deploy/bench/peers.sh` and pass its directory as `PEERS_DIR`): xdp-filter, UDP ports only",
				"| every tierlimit path ≥ 2.5× faster than xdp-firewall (issue 42) | not measured (no PEERS_DIR)")
		}
		for _, w := range wants {
			if !strings.Contains(s, w) {
				t.Errorf("peers %v: report lacks %q:\n%s", with, w, s)
			}
		}
	}
}
