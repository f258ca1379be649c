package bpf_test

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// BenchmarkFleet measures the fleet path (docs/design.md §12: a fleet
// policy, the others' sum > 0 joining R̂) beside the smooth path (the
// same tiers at max = fleet.max, no fleet, others 0) and a bare XDP_DROP,
// in one run, chunk by chunk on the same frame (bestChunks). It reports
// ns/pkt of the fleet path, smooth-ns/pkt, and x-smooth, their ratio,
// which the contract bounds at 1.05. "pass" stays in tier 0 (no draw) on
// both; "drop" is far past the table on both (q from the memoised closed
// form, a draw per packet), the others' sum putting the fleet there
// where the smooth path's own flood puts it; "alone-drop" is the fleet
// path past the view's expiry (fleet.h), the fallback's multiplier
// putting it there. Both are onsets (a fresh hour's window), where the
// fleet with a view scales the others' sums by the member's rise since
// its report (SetFleetOwn).
func BenchmarkFleet(b *testing.B) {
	policy := func(max uint64) tiers.Policy {
		p := ordinalDefault()
		p.Shape, p.Window, p.Max = tiers.ShapeSmooth, time.Hour, max
		p.Record = tiers.Record{}
		return p
	}
	fleet := func(max uint64) tiers.Policy {
		p := policy(40000)
		p.Fleet = &tiers.Fleet{Name: "b", Store: "redis://h", Max: max, Report: 100 * time.Millisecond, TTL: 3 * time.Second}
		return p
	}
	for _, path := range []struct {
		name   string
		max    uint64
		others uint64
		alone  bool // the view expired: judged at the fallback's multiplier (fleet.h)
	}{
		{"pass", 100_000_000, 1_000_000, false},
		{"drop", 100, 1_000_000, false},
		{"alone-drop", 100, 1_000_000, true},
	} {
		b.Run(path.name, func(b *testing.B) {
			opts := bpf.Options{TickNs: kernelTick(b)}
			sm := newHarnessOpts(b, policy(path.max), opts)
			fl := newHarnessOpts(b, fleet(path.max), opts)
			// What the sums answer (the fleet's first second): a member
			// count and an own R̂ at the report that the flood's R̂ rises
			// past, so that the onset scales the sums per packet
			// (fleet.h tl_fleet_others_now).
			if err := fl.l.SetFleetOwn(1<<26, 1<<26, 3); err != nil {
				b.Fatal(err)
			}
			if err := fl.l.SetFleetOthers(path.others, path.others); err != nil {
				b.Fatal(err)
			}
			if path.alone {
				if err := fl.l.SetFleetFallback(tiers.FleetFallbackMult(path.max, 1)); err != nil {
					b.Fatal(err)
				}
				if err := fl.l.SetFleetView(path.others, path.others, 0); err != nil {
					b.Fatal(err)
				}
			}
			sm.expire()
			fl.expire()
			frame := UDP4(b, 514)
			progs := []*ebpf.Program{fl.l.Program(), sm.l.Program(), BareProgram(b, xdpDrop)}
			best := bestChunks(b, frame, progs...)
			b.ReportMetric(best[0], "ns/pkt")
			b.ReportMetric(best[1], "smooth-ns/pkt")
			b.ReportMetric(best[2], "bare-ns/pkt")
			b.ReportMetric(best[0]/best[1], "x-smooth")
			// The kernel's own figure, which leaves out the time the
			// test run was scheduled out: steadier on a loaded machine.
			kern := kernelChunks(b, frame, progs[:2]...)
			b.ReportMetric(kern[0], "kern-ns/pkt")
			b.ReportMetric(kern[1], "kern-smooth-ns/pkt")
			b.ReportMetric(kern[0]/kern[1], "kern-x-smooth")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// kernelChunks is bestChunks as the kernel measures each chunk
// (BPF_PROG_TEST_RUN's duration, whole ns per packet, which pauses while
// the run is rescheduled).
func kernelChunks(b *testing.B, frame []byte, progs ...*ebpf.Program) []float64 {
	return chunkMinima(b, func(prog *ebpf.Program, n int) (float64, error) {
		_, d, err := prog.Benchmark(frame, n, nil)
		return float64(d.Nanoseconds()), err
	}, progs...)
}
