package bpf_test

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// BenchmarkLiveFramesSources is BenchmarkLiveFrames with per-source budgets
// on (docs/design.md §6), on the two drop paths a flood takes:
//   - over-budget: one source far over its budget, dropped after the
//     sketch's plain reads (no atomics) and the top table's update;
//   - within-budget: every packet within its group's budget (a budget of
//     10^9), so it pays the sketch's atomic adds, then the window and the
//     100% tier drop it, as in a spoofed flood of small groups.
//
// It reports the best chunk's Mpps for tierlimit and a bare XDP_DROP
// (liveChunks) and their ratio.
func BenchmarkLiveFramesSources(b *testing.B) {
	for _, c := range []struct {
		name string
		p    tiers.Policy
	}{
		{"over-budget", withSources(dropPolicy(), tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64})},
		{"within-budget", func() tiers.Policy {
			p := dropPolicy()
			p.Max = 1_000_000_000
			p.Tiers = []tiers.Tier{{At: tiers.MustParsePercent("0.00001"), Drop: tiers.Pct(100)}} // T = 100
			return withSources(p, tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64})
		}()},
	} {
		b.Run(c.name, func(b *testing.B) { benchLiveDrop(b, c.p) })
	}
}

// dropped counts every drop: tiers' and budgets'.
func dropped(st bpf.Stats) uint64 {
	return st.SelectedTotal(tiers.VerdictDrop).Packets + st.OverBudget[tiers.VerdictDrop].Packets
}

func benchLiveDrop(b *testing.B, p tiers.Policy) {
	h := newHarness(b, p)
	bare := BareProgram(b, xdpDrop)
	frame := UDP4(b, 514)
	ns := NewNS(b)

	// Safety: both programs must drop this frame before it is run live.
	h.preload(1_000_000)
	h.run(frame) // over budget from the second packet on, where the budget is 1
	if got := h.run(frame); got != xdpDrop {
		b.Fatalf("tierlimit returns %d on the benchmark frame, want XDP_DROP (%d): refusing a live run", got, xdpDrop)
	}
	if got, err := bare.Run(&ebpf.RunOptions{Data: frame}); err != nil || got != xdpDrop {
		b.Fatalf("bare program returns %d (%v), want XDP_DROP: refusing a live run", got, err)
	}
	check := func(s0, s1 bpf.Stats, n uint32) (uint64, error) {
		if got := dropped(s1) - dropped(s0); got < uint64(n) {
			return 0, fmt.Errorf("tierlimit dropped %d of %d live frames", got, n)
		}
		return uint64(n), nil
	}
	best := liveChunks(b, ns, h, frame, check, bare)
	tl, br := best[0], best[1]
	b.ReportMetric(tl, "Mpps")
	b.ReportMetric(br, "bare-Mpps")
	b.ReportMetric(tl/br, "x-bare")
	b.ReportMetric(0, "ns/op")
}
