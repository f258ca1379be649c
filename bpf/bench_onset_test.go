package bpf_test

import (
	"testing"

	"github.com/cilium/ebpf"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// BenchmarkOnsetBefore measures the smooth shape's selected paths in
// today's program beside layout 3's (bpf/testdata/layout-3, main before
// issue 39's onset from the recent rate), and a bare XDP_DROP, best chunk
// of each with each first in turn, in the same run (BPF_PROG_TEST_RUN), as
// BenchmarkProfileBefore does. x-before-kernel is today's kernel time per
// chunk over layout 3's (issue 39 bounds it at 1.05):
//   - pass: tier 0 under max 10^12, every packet passes;
//   - drop: a saturated window far past the table, q(R̂) and a draw;
//   - budgets-pass and budgets-drop: the same with budgets on, the one
//     group within its budget (100 % of max).
func BenchmarkOnsetBefore(b *testing.B) {
	in := tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64}
	// The pass paths' max is so high that the benchmark's own rate over
	// the hour's window (a few 10^9) stays below T_1 in both programs:
	// at 10^8 today's program reads it as the flood it is (E, its rate
	// over a window, passes max) and drops, where layout 3 held its
	// extrapolation to 32 n (the 1/32 floor) and passed.
	big := func(p tiers.Policy) tiers.Policy { p.Max = 1_000_000_000_000; return p }
	for _, path := range []struct {
		name string
		p    tiers.Policy
	}{
		{"pass", big(smooth(dropPolicy()))},
		{"drop", smooth(dropPolicy())},
		{"budgets-pass", big(smooth(withSources(dropPolicy(), in)))},
		{"budgets-drop", smooth(withSources(dropPolicy(), in))},
	} {
		b.Run(path.name, func(b *testing.B) {
			frame := UDP4(b, 514)
			h := newHarness(b, path.p)
			old := objectHarness(b, path.p, "testdata/layout-3/limiter_bpfel.o")
			h.expire()
			old.expire()
			bare := BareProgram(b, xdpDrop)
			for _, prog := range []*ebpf.Program{h.l.Program(), old.l.Program()} {
				if _, err := runExact(prog, frame, 200); err != nil {
					b.Fatal(err)
				}
			}
			best := bestRotated(b, frame, h.l.Program(), old.l.Program(), bare)
			// The kernel's own timing, each program first in turn.
			kern := kernelChunks(b, frame, h.l.Program(), old.l.Program())
			rev := kernelChunks(b, frame, old.l.Program(), h.l.Program())
			kern[0], kern[1] = min(kern[0], rev[1]), min(kern[1], rev[0])
			b.ReportMetric(best[0], "ns/pkt")
			b.ReportMetric(best[1], "before-ns/pkt")
			b.ReportMetric(best[2], "bare-ns/pkt")
			b.ReportMetric(best[0]/best[1], "x-before")
			b.ReportMetric(kern[0], "kernel-ns/pkt")
			b.ReportMetric(kern[1], "before-kernel-ns/pkt")
			b.ReportMetric(kern[0]/kern[1], "x-before-kernel")
			b.ReportMetric(0, "ns/op")
		})
	}
}
