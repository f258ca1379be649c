package bpf_test

import (
	"math"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// benchChunk is how many packets one BPF_PROG_TEST_RUN call runs.
const benchChunk = 1 << 17

// BenchmarkProgram measures the program's cost per packet with
// BPF_PROG_TEST_RUN on each path, beside a bare XDP_DROP program measured
// in the same benchmark, chunk by chunk, on the same frame. It reports
// ns/pkt for both (best chunk, wall time per packet) and their ratio
// (x-bare). "gate" is the agent's configuration (tick gate on); "exact"
// reads bpf_ktime_get_ns for every selected packet.
func BenchmarkProgram(b *testing.B) {
	policy := func(max uint64, ts ...tiers.Tier) tiers.Policy {
		p := tiers.Default()
		p.Window, p.Max = time.Hour, max
		if len(ts) > 0 {
			p.Tiers = ts
		}
		return p
	}
	paths := []struct {
		name  string
		p     tiers.Policy
		frame []byte
	}{
		// Tier 0 for 7*10^7 packets: every packet passes.
		{"selected-pass", policy(100_000_000), UDP4(b, 514)},
		// From n = 1, a 50% tier: every packet draws bpf_get_prandom_u32.
		{"selected-random", policy(100, tiers.Tier{At: tiers.Pct(1), Drop: tiers.Pct(50)}), UDP4(b, 514)},
		// From n = 100, the 100% tier: every packet is dropped, no draw.
		{"selected-drop", policy(100), UDP4(b, 514)},
		{"unselected", policy(100), TCP4(b, 22, true, false)},
		// Severity on (DESIGN.md §7): the <PRI> is read and classed on
		// every selected UDP packet; <134> is local0.info, class normal.
		{"selected-pass-severity", withSeverity(policy(100_000_000)), UDP4(b, 514)},
		{"selected-drop-severity", withSeverity(policy(100)), UDP4(b, 514)},
		// selected-pass with per-source budgets on (DESIGN.md §6): the
		// group stays within its budget, so each packet pays the hash and
		// the sketch's TL_SKETCH_ROWS cells, then the tiers as before.
		{"sources-pass", withSources(policy(100_000_000), tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64}), UDP4(b, 514)},
		{"sources-pass-ipv6", withSources(policy(100_000_000), tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64}), UDP6(b, 514)},
		// From the second packet on, over budget: sketch, over-budget
		// counter and the top table's LRU lookup, then XDP_DROP.
		{"sources-over", withSources(policy(100_000_000), tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64}), UDP4(b, 514)},
	}
	for _, gate := range []bool{true, false} {
		opts := bpf.Options{}
		name := "exact"
		if gate {
			opts.TickNs = kernelTick(b)
			name = "gate"
		}
		for _, path := range paths {
			b.Run(name+"/"+path.name, func(b *testing.B) {
				h := newHarnessOpts(b, path.p, opts)
				bareProg := BareProgram(b, xdpDrop)
				h.expire() // the first packet opens a window, as in traffic
				benchPaired(b, h.l.Program(), bareProg, path.frame)
			})
		}
	}
}

func withSeverity(p tiers.Policy) tiers.Policy {
	p.Severity = &tiers.Severity{Protect: []int{0, 1, 2, 3}, ProtectBudget: tiers.Pct(5), ShedFirst: []int{7}}
	return p
}

func withSources(p tiers.Policy, s tiers.Sources) tiers.Policy {
	p.Sources = s
	return p
}

// benchPaired runs prog and bare on frame, alternating chunk by chunk so
// that both see the same machine, and reports ns/pkt for each and their
// ratio, x-bare. A chunk's time is the wall time around its
// BPF_PROG_TEST_RUN call over its packets (the kernel's own figure is whole
// ns per packet, too coarse for a bare program), and each program's figure
// is its best chunk's: on a shared machine other jobs only ever slow a chunk
// down.
func benchPaired(b *testing.B, prog, bare *ebpf.Program, frame []byte) {
	b.Helper()
	progNs, bareNs := math.Inf(1), math.Inf(1)
	for done := 0; done < b.N; done += benchChunk {
		n := min(benchChunk, b.N-done)
		d, err := timeRun(prog, frame, uint32(n))
		if err != nil {
			b.Fatal(err)
		}
		db, err := timeRun(bare, frame, uint32(n))
		if err != nil {
			b.Fatal(err)
		}
		progNs = min(progNs, float64(d.Nanoseconds())/float64(n))
		bareNs = min(bareNs, float64(db.Nanoseconds())/float64(n))
	}
	b.ReportMetric(progNs, "ns/pkt")
	b.ReportMetric(bareNs, "bare-ns/pkt")
	b.ReportMetric(progNs/bareNs, "x-bare")
	b.ReportMetric(0, "ns/op")
}

// timeRun runs prog repeat times on frame (runExact) and returns the wall
// time of the call.
func timeRun(prog *ebpf.Program, frame []byte, repeat uint32) (time.Duration, error) {
	start := time.Now()
	_, err := runExact(prog, frame, repeat)
	return time.Since(start), err
}
