package bpf_test

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// beforeSmooth loads the program issue 32 started from (layout 1,
// bpf/testdata/layout-1) with policy p, as newHarness loads today's.
func beforeSmooth(b *testing.B, p tiers.Policy) *harness {
	b.Helper()
	return objectHarness(b, p, "testdata/layout-1/limiter_bpfel.o")
}

// objectHarness loads the BPF object at path, an earlier build (the
// benchmarks' baselines), with policy p, as newHarness loads today's.
func objectHarness(b *testing.B, p tiers.Policy, path string) *harness {
	b.Helper()
	Require(b)
	l, err := bpf.LoadObject(bpf.Options{TickNs: kernelTick(b)}, path)
	if err != nil {
		b.Fatal(err)
	}
	return newHarnessWith(b, p, l)
}

// BenchmarkSmoothBefore measures the smooth shape's paths in today's
// program beside the program issue 32 started from (layout 1), and a bare
// XDP_DROP, best chunk of each with each first in turn, in the same run
// (BPF_PROG_TEST_RUN). It reports ns/pkt for each and x-before (today's
// over the earlier program's; issue 32 bounds it at 1.05 on the selected
// path):
//   - selected: tier 0 under max 10^8, every packet passes (q = 0);
//   - drop: a saturated window far past the table, q(R̂) from the memoised
//     closed form and a draw per packet;
//   - sources-over: one group over its budget (1) at max 100, judged per
//     packet on the live counts (today) or at its tick's threshold (before).
func BenchmarkSmoothBefore(b *testing.B) {
	budget1 := tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64}
	for _, path := range []struct {
		name string
		p    tiers.Policy
	}{
		{"selected", func() tiers.Policy { p := smooth(dropPolicy()); p.Max = 100_000_000; return p }()},
		{"drop", smooth(dropPolicy())},
		{"sources-over", smooth(withSources(dropPolicy(), budget1))},
	} {
		b.Run(path.name, func(b *testing.B) {
			frame := UDP4(b, 514)
			h := newHarness(b, path.p)
			old := beforeSmooth(b, path.p)
			h.expire()
			// The earlier program's window is shorter than today's
			// (issue 32's and the budgets' fields came since).
			if err := old.l.ZeroWindow(); err != nil {
				b.Fatal(err)
			}
			bare := BareProgram(b, xdpDrop)
			for _, prog := range []*ebpf.Program{h.l.Program(), old.l.Program()} {
				if _, err := runExact(prog, frame, 200); err != nil {
					b.Fatal(err)
				}
			}
			best := bestRotated(b, frame, h.l.Program(), old.l.Program(), bare)
			b.ReportMetric(best[0], "ns/pkt")
			b.ReportMetric(best[1], "before-ns/pkt")
			b.ReportMetric(best[2], "bare-ns/pkt")
			b.ReportMetric(best[0]/best[1], "x-before")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkLiveFramesSmoothBefore is BenchmarkLiveFramesSmooth with the
// program issue 32 started from (layout 1) as the control: live frames on
// the smooth drop path, today's Mpps over the earlier program's
// (x-before; issue 32 bounds it at 0.95 or more), chunk by chunk in the
// same run.
func BenchmarkLiveFramesSmoothBefore(b *testing.B) {
	sp := smooth(dropPolicy())
	h := newHarness(b, sp)
	old := beforeSmooth(b, sp)
	frame := UDP4(b, 514)
	ns := NewNS(b)
	for _, x := range []*harness{h, old} {
		x.expire()
		x.repeat(frame, 1000)
	}
	check := func(s0, s1 bpf.Stats, n uint32) (uint64, error) {
		judged := s1.SelectedPackets() - s0.SelectedPackets()
		if judged < uint64(n) {
			return 0, fmt.Errorf("smooth judged %d of %d live frames", judged, n)
		}
		return judged, nil
	}
	best := liveChunks(b, ns, h, frame, check, old.l.Program())
	b.ReportMetric(best[0], "Mpps")
	b.ReportMetric(best[1], "before-Mpps")
	b.ReportMetric(best[0]/best[1], "x-before")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkProfileBefore measures the budgets' paths of the smooth shape
// in today's program beside layout 2's (bpf/testdata/layout-2, the
// program before the in-budget profile, smooth_prof.h), and a bare
// XDP_DROP, best chunk of each with each first in turn, in the same run
// (BPF_PROG_TEST_RUN), as BenchmarkSmoothBefore does: x-before is
// today's ns/pkt over layout 2's. The profile costs a call per tick and
// CPU (sm_prof_take and sm_prof_share, at the refresh), nothing per
// packet:
//   - sources-in: one group within its budget at max 10^8, every packet
//     in budget and passed;
//   - sources-over: one group over its budget (1) at max 100.
func BenchmarkProfileBefore(b *testing.B) {
	for _, path := range []struct {
		name string
		p    tiers.Policy
	}{
		{"sources-in", func() tiers.Policy {
			p := smooth(withSources(dropPolicy(), tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64}))
			p.Max = 100_000_000
			return p
		}()},
		{"sources-over", smooth(withSources(dropPolicy(), tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64}))},
	} {
		b.Run(path.name, func(b *testing.B) {
			frame := UDP4(b, 514)
			h := newHarness(b, path.p)
			old := objectHarness(b, path.p, "testdata/layout-2/limiter_bpfel.o")
			h.expire()
			old.expire()
			bare := BareProgram(b, xdpDrop)
			for _, prog := range []*ebpf.Program{h.l.Program(), old.l.Program()} {
				if _, err := runExact(prog, frame, 200); err != nil {
					b.Fatal(err)
				}
			}
			best := bestRotated(b, frame, h.l.Program(), old.l.Program(), bare)
			// The kernel's own timing of each chunk (BPF_PROG_TEST_RUN's
			// duration), without the syscall's: the wall clock's
			// differences at this scale are the syscall's noise.
			kern := kernelChunks(b, frame, h.l.Program(), old.l.Program())
			b.ReportMetric(best[0], "ns/pkt")
			b.ReportMetric(best[1], "before-ns/pkt")
			b.ReportMetric(best[2], "bare-ns/pkt")
			b.ReportMetric(best[0]/best[1], "x-before")
			b.ReportMetric(kern[0]/kern[1], "x-before-kernel")
			b.ReportMetric(0, "ns/op")
		})
	}
}
