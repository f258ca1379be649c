package bpf_test

import (
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// BenchmarkRecord measures the shed record's cost on the drop paths
// (DESIGN.md §10): the same path with sampling on at the default cap
// (100/s) and off, two limiters alternating chunk by chunk with a bare
// XDP_DROP program in the same run. It reports ns/pkt of each and x-off,
// sampling on over off: the cost an unsampled shed packet pays for the
// gate's check (and, 100 times a second, a sample); share-x-off is the
// same with the eligible share below 1, as the agent sets it under a
// flood, where every shed packet also draws a random number.
func BenchmarkRecord(b *testing.B) {
	policy := func(samples uint32, s tiers.Sources) tiers.Policy {
		p := ordinalDefault()
		p.Window, p.Max = time.Hour, 100
		p.Sources = s
		p.Record = tiers.Record{Samples: samples, Snaplen: tiers.RecordSnapMax}
		return p
	}
	for _, path := range []struct {
		name string
		src  tiers.Sources
	}{
		// From n = 100, the 100% tier: every packet is dropped.
		{"selected-drop", tiers.Sources{}},
		// Over budget from the second packet on, dropped.
		{"sources-over", tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64}},
	} {
		b.Run(path.name, func(b *testing.B) {
			opts := bpf.Options{TickNs: kernelTick(b)}
			on := newHarnessOpts(b, policy(tiers.DefaultRecordSamples, path.src), opts)
			// share: as the agent sets it under a flood, a few times the
			// cap over the shed rate: every shed packet draws.
			share := newHarnessOpts(b, policy(tiers.DefaultRecordSamples, path.src), opts)
			if err := share.l.SetRecordShare(0.001); err != nil {
				b.Fatal(err)
			}
			off := newHarnessOpts(b, policy(0, path.src), opts)
			frame := UDP4(b, 514)
			on.expire()
			share.expire()
			off.expire()
			best := bestChunks(b, frame, on.l.Program(), share.l.Program(), off.l.Program(), BareProgram(b, xdpDrop))
			b.ReportMetric(best[0], "on-ns/pkt")
			b.ReportMetric(best[1], "share-ns/pkt")
			b.ReportMetric(best[2], "off-ns/pkt")
			b.ReportMetric(best[3], "bare-ns/pkt")
			b.ReportMetric(best[0]/best[2], "x-off")
			b.ReportMetric(best[1]/best[2], "share-x-off")
			b.ReportMetric(0, "ns/op")
			if s, l, err := on.l.RecordCounts(); err != nil || b.N > 1000 && s+l == 0 {
				b.Fatalf("sampling on took no sample (%d, %d, %v)", s, l, err)
			}
		})
	}
}
