package bpf_test

import (
	"testing"

	"github.com/cilium/ebpf"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// BenchmarkCountBytes measures count: bytes beside count: packets on the
// selected path, in the same run, on the same frame (a syslog datagram),
// with today's program loaded twice, and beside layout 4's program (main
// before count: bytes) under count: packets; best chunk of each with each
// first in turn (BPF_PROG_TEST_RUN). It reports ns/pkt for each,
// x-packets (bytes over packets; issue 41 bounds it at 1.05) and
// x-before (today's packets over layout 4's: what the weight costs a
// policy that does not use it):
//   - pass: tier 0, every packet passes (max 10^8 packets, 10^11 bytes);
//   - drop: a saturated window past the table (max 100 packets, 10 KB),
//     the last tier's draw on every packet;
//   - sources: one group within its budget (100 %), every packet passes.
//
// Each in the ordinal and the smooth shape.
func BenchmarkCountBytes(b *testing.B) {
	all := tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64}
	for _, path := range []struct {
		name       string
		p          tiers.Policy
		maxPackets uint64
		maxBytes   uint64
	}{
		{"pass", dropPolicy(), 100_000_000, 100_000_000_000},
		{"drop", dropPolicy(), 100, 10_000},
		{"sources", withSources(dropPolicy(), all), 100_000_000, 100_000_000_000},
	} {
		for _, shape := range []tiers.Shape{tiers.ShapeOrdinal, tiers.ShapeSmooth} {
			b.Run(path.name+"-"+shape.String(), func(b *testing.B) {
				pp := path.p
				pp.Shape, pp.Max = shape, path.maxPackets
				pb := pp
				pb.Count, pb.Max = tiers.CountBytes, path.maxBytes
				frame := UDP4(b, 514)
				hp, hb := newHarness(b, pp), newHarness(b, pb)
				old := objectHarness(b, pp, "testdata/layout-4/limiter_bpfel.o")
				for _, h := range []*harness{hp, hb, old} {
					h.expire()
				}
				bare := BareProgram(b, xdpDrop)
				for _, prog := range []*ebpf.Program{hp.l.Program(), hb.l.Program(), old.l.Program()} {
					if _, err := runExact(prog, frame, 200); err != nil {
						b.Fatal(err)
					}
				}
				best := bestRotated(b, frame, hp.l.Program(), hb.l.Program(), old.l.Program(), bare)
				b.ReportMetric(best[0], "packets-ns/pkt")
				b.ReportMetric(best[1], "bytes-ns/pkt")
				b.ReportMetric(best[2], "before-ns/pkt")
				b.ReportMetric(best[3], "bare-ns/pkt")
				b.ReportMetric(best[1]/best[0], "x-packets")
				b.ReportMetric(best[0]/best[2], "x-before")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
