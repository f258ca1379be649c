package bpf_test

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// BenchmarkProgram measures the program's cost per packet with
// BPF_PROG_TEST_RUN on each path, beside a bare XDP_DROP program measured
// in the same benchmark, chunk by chunk, on the same frame. It reports
// ns/pkt for both (best chunk, wall time per packet) and their ratio
// (x-bare). "gate" is the agent's configuration (tick gate on); "exact"
// reads bpf_ktime_get_ns for every selected packet.
//
// On the paths where docs/design.md's exact semantics make atomic adds
// unavoidable, a third program runs in the same alternation: the floor
// (testenv.AtomicFloorProgram), a bare XDP_DROP that makes the path's
// atomic adds and nothing else. Every selected packet below T_last adds to
// the shared window count (§2, exact n), and with per-source budgets (§6)
// a packet within budget also adds to one cell per sketch row. It then
// reports floor-ns/pkt, x-floor (tierlimit over floor), floor-x-bare and
// floor-atomics, the floor's atomic adds per packet.
func BenchmarkProgram(b *testing.B) {
	policy := func(max uint64, ts ...tiers.Tier) tiers.Policy {
		p := ordinalDefault()
		p.Window, p.Max = time.Hour, max
		if len(ts) > 0 {
			p.Tiers = ts
		}
		p.Record = tiers.Record{} // sampling off; BenchmarkRecord has it on
		return p
	}
	within := tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64}
	paths := []struct {
		name  string
		p     tiers.Policy
		frame []byte
		// atomics is the floor's count of atomic adds per packet; 0 for
		// none (the floor is bare: no floor program).
		atomics int
	}{
		// Tier 0 for 0.7 × benchPassMax packets: every packet passes.
		{"selected-pass", policy(benchPassMax), UDP4(b, 514), 1},
		// selected-pass with the rules' dests: local resolved as the
		// agent does, to a host's dozen destinations: one LPM lookup more.
		{"selected-pass-local", localDests(policy(benchPassMax)), UDP4(b, 514), 1},
		// From n = 1, a 50% tier: every packet draws bpf_get_prandom_u32.
		{"selected-random", policy(100, tiers.Tier{At: tiers.Pct(1), Drop: tiers.Pct(50)}), UDP4(b, 514), 1},
		// From n = 100, the 100% tier: every packet is dropped, no draw,
		// and no shared add (the saturated window's fast path).
		{"selected-drop", policy(100), UDP4(b, 514), 0},
		{"unselected", policy(100), TCP4(b, 22, true, false), 0},
		// Severity on (docs/design.md §7): the <PRI> is read and classed on
		// every selected UDP packet; <134> is local0.info, class normal,
		// which never touches the debt on these paths.
		{"selected-pass-severity", withSeverity(policy(benchPassMax)), UDP4(b, 514), 1},
		{"selected-drop-severity", withSeverity(policy(100)), UDP4(b, 514), 0},
		// selected-pass with per-source budgets on (docs/design.md §6): the
		// group stays within its budget, so each packet pays the hash and
		// the sketch's TL_SKETCH_ROWS cells, then the tiers as before.
		{"sources-pass", withSources(policy(benchPassMax), within), UDP4(b, 514), 1 + bpf.SketchRows},
		{"sources-pass-ipv6", withSources(policy(benchPassMax), within), UDP6(b, 514), 1 + bpf.SketchRows},
		// From the second packet on, over budget: sketch, over-budget
		// counter and the top table's LRU lookup, then XDP_DROP.
		{"sources-over", withSources(policy(benchPassMax), tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64}), UDP4(b, 514), 0},
		// The smooth shape (docs/design.md §9): the per-CPU estimate, R̂ and
		// q(R̂) on every selected packet. smooth-pass stays below T_1
		// (q = 0, no draw); smooth-drop is a flood far past the table
		// (q from the memoised closed form, a draw per packet), the
		// counterpart of selected-random and selected-drop; and the
		// over-budget path judged at the per-tick share.
		{"smooth-pass", smooth(policy(benchPassMax)), UDP4(b, 514), 1},
		{"smooth-drop", smooth(policy(100)), UDP4(b, 514), 0},
		{"smooth-sources-over", smooth(withSources(policy(benchPassMax), tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64})), UDP4(b, 514), 0},
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
				progs := benchProgs{prog: h.l.Program(), bare: BareProgram(b, xdpDrop)}
				if path.atomics > 0 {
					progs.floor, progs.cells = AtomicFloorProgram(b, path.atomics)
				}
				h.expire() // the first packet opens a window, as in traffic
				benchPaired(b, progs, path.frame)
			})
		}
	}
}

// localDests resolves p's dests: local as the agent would on a host with
// the addresses of testenv's frames and a few more: its own addresses
// unicast, the broadcast and multicast ones not (tiers.LocalDest).
func localDests(p tiers.Policy) tiers.Policy {
	var local []tiers.LocalDest
	for _, s := range []string{"127.0.0.0/8", "127.0.0.1/32", "198.51.100.1/32", "10.1.2.3/32", "::1/128", "2001:db8::2/128", "fe80::1/128"} {
		local = append(local, tiers.LocalDest{Prefix: netip.MustParsePrefix(s), Unicast: true})
	}
	for _, s := range []string{"198.51.100.255/32", "10.1.255.255/32", "224.0.0.0/4", "ff00::/8"} {
		local = append(local, tiers.LocalDest{Prefix: netip.MustParsePrefix(s)})
	}
	return p.WithLocal(local)
}

func smooth(p tiers.Policy) tiers.Policy {
	p.Shape = tiers.ShapeSmooth
	return p
}

func withSeverity(p tiers.Policy) tiers.Policy {
	p.Severity = &tiers.Severity{Protect: []int{0, 1, 2, 3}, ProtectBudget: tiers.Pct(5), ShedFirst: []int{7}}
	return p
}

func withSources(p tiers.Policy, s tiers.Sources) tiers.Policy {
	p.Sources = s
	return p
}

// benchProgs are the programs benchPaired alternates: tierlimit, a bare
// XDP_DROP and, when not nil, a floor program with its cells
// (testenv.AtomicFloorProgram).
type benchProgs struct {
	prog, bare, floor *ebpf.Program
	cells             *ebpf.Map
}

// benchPaired runs progs on frame, alternating chunk by chunk so that all
// see the same machine, and reports ns/pkt for each and their ratios:
// x-bare, and with a floor floor-ns/pkt, x-floor (tierlimit over floor),
// floor-x-bare and floor-atomics (its atomic adds per packet). A chunk's
// time is the wall time around its BPF_PROG_TEST_RUN call over its packets
// (the kernel's own figure is whole ns per packet, too coarse for a bare
// program), and each program's figure is its best chunk's: on a shared
// machine other jobs only ever slow a chunk down. The floor's cells must
// each have counted every packet it ran.
func benchPaired(b *testing.B, progs benchProgs, frame []byte) {
	b.Helper()
	run := []*ebpf.Program{progs.prog, progs.bare}
	if progs.floor != nil {
		run = append(run, progs.floor)
	}
	best := bestChunks(b, frame, run...)
	progNs, bareNs := best[0], best[1]
	b.ReportMetric(progNs, "ns/pkt")
	b.ReportMetric(bareNs, "bare-ns/pkt")
	b.ReportMetric(progNs/bareNs, "x-bare")
	if progs.floor != nil {
		floorNs := best[2]
		checkFloorCells(b, progs.cells, chunkPackets(b))
		b.ReportMetric(floorNs, "floor-ns/pkt")
		b.ReportMetric(progNs/floorNs, "x-floor")
		b.ReportMetric(floorNs/bareNs, "floor-x-bare")
		b.ReportMetric(float64(progs.cells.MaxEntries()), "floor-atomics")
	}
	b.ReportMetric(0, "ns/op")
}

// bestChunks runs progs on frame in turn, chunk by chunk (benchTiming's
// chunk), and returns each one's fastest chunk in ns per packet: the wall
// time of the call less the call's fixed cost (hostTiming.Fixed), over
// its packets. On a shared machine other jobs only ever slow a chunk down.
func bestChunks(b *testing.B, frame []byte, progs ...*ebpf.Program) []float64 {
	fixed := benchTiming(b).Fixed
	return chunkMinima(b, func(prog *ebpf.Program, n int) (float64, error) {
		d, err := timeRun(prog, frame, uint32(n))
		return float64((d - fixed).Nanoseconds()) / float64(n), err
	}, progs...)
}

// chunkMinima runs progs in turn, chunk by chunk (benchTiming's chunk,
// sized to the host's tick), for chunkRounds(b.N) rounds, and returns each
// one's least ns per packet as perPacket measures a chunk of n.
func chunkMinima(b *testing.B, perPacket func(prog *ebpf.Program, n int) (float64, error), progs ...*ebpf.Program) []float64 {
	b.Helper()
	chunk := benchTiming(b).Chunk
	best := inf(len(progs))
	for range chunkRounds(b.N, chunk) {
		for i, prog := range progs {
			ns, err := perPacket(prog, chunk)
			if err != nil {
				b.Fatal(err)
			}
			best[i] = min(best[i], ns)
		}
	}
	return best
}

// chunkPackets is how many packets chunkMinima runs of each program.
func chunkPackets(b *testing.B) uint64 {
	chunk := benchTiming(b).Chunk
	return uint64(chunkRounds(b.N, chunk) * chunk)
}

// checkFloorCells fails tb unless every cell of a floor program's map
// counted at least runs packets: the floor made its atomic adds.
func checkFloorCells(tb testing.TB, cells *ebpf.Map, runs uint64) {
	tb.Helper()
	var (
		key uint32
		val [FloorLine]byte
	)
	it := cells.Iterate()
	for it.Next(&key, &val) {
		if got := binary.LittleEndian.Uint64(val[:]); got < runs {
			tb.Fatalf("floor cell %d counted %d packets, want at least %d", key, got, runs)
		}
	}
	if err := it.Err(); err != nil {
		tb.Fatal(err)
	}
}

// timeRun runs prog repeat times on frame (runExact) and returns the wall
// time of the call.
func timeRun(prog *ebpf.Program, frame []byte, repeat uint32) (time.Duration, error) {
	start := time.Now()
	_, err := runExact(prog, frame, repeat)
	return time.Since(start), err
}
