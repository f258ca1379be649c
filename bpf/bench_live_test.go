package bpf_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// testXDPLiveFrames is BPF_F_TEST_XDP_LIVE_FRAMES (include/uapi/linux/bpf.h):
// BPF_PROG_TEST_RUN builds a real xdp_frame for every repetition and carries
// out the verdict (XDP_PASS goes to the stack of the ingress device, XDP_TX
// out of it), so the cost includes frame setup and the page pool recycling
// of a dropped frame, as on a driver's receive path. Linux >= 5.18.
const testXDPLiveFrames = 1 << 1

// xdpMD is struct xdp_md (include/uapi/linux/bpf.h), the context that
// BPF_PROG_TEST_RUN takes for XDP. Data is the metadata length (0) and
// DataEnd the frame's length; the kernel rejects any other layout.
// IngressIfindex names a device of the caller's network namespace.
type xdpMD struct {
	Data           uint32
	DataEnd        uint32
	DataMeta       uint32
	IngressIfindex uint32
	RxQueueIndex   uint32
	EgressIfindex  uint32
}

// dropPolicy saturates at once: max 100 with the default tiers, so that
// after 100 packets of a window every selected packet is in the
// 100% tier and is dropped without a draw. The window is an hour long.
func dropPolicy() tiers.Policy {
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, 100
	return p
}

// BenchmarkLiveFrames measures, in live-frames mode, the packet rate of
// tierlimit on its drop path (window saturated, 100% tier) beside a bare
// XDP_DROP program, chunk by chunk on the same frame in the same run. It
// reports the best chunk's Mpps for both (on a shared machine other jobs only
// ever slow a chunk down) and their ratio (x-bare, higher is better for
// tierlimit). Frames are injected on lo of a network namespace that the
// benchmark creates and removes; both programs are checked to drop the frame
// before any live run, so no frame reaches a stack. Mpps is from wall time
// around each call, with the Go runtime's preemption signal blocked so that
// no call is restarted.
func BenchmarkLiveFrames(b *testing.B) {
	h := newHarness(b, dropPolicy())
	bare := BareProgram(b, xdpDrop)
	touch := touchProgram(b)
	frame := UDP4(b, 514)
	ns := NewNS(b)

	// A window opened by a packet, as in traffic, so that the tick gate
	// (the agent's configuration) spares the clock, and saturated.
	h.expire()
	h.repeat(frame, 1000)
	// Safety: every program must drop this frame before it is run live.
	if got := h.run(frame); got != xdpDrop {
		b.Fatalf("tierlimit returns %d on the benchmark frame, want XDP_DROP (%d): refusing a live run", got, xdpDrop)
	}
	for _, p := range []*ebpf.Program{bare, touch} {
		if got, err := p.Run(&ebpf.RunOptions{Data: frame}); err != nil || got != xdpDrop {
			b.Fatalf("control program returns %d (%v), want XDP_DROP: refusing a live run", got, err)
		}
	}

	check := func(s0, s1 bpf.Stats, n uint32) (uint64, error) {
		dropped := s1.SelectedTotal(tiers.VerdictDrop).Packets - s0.SelectedTotal(tiers.VerdictDrop).Packets
		passed := s1.SelectedTotal(tiers.VerdictPass).Packets - s0.SelectedTotal(tiers.VerdictPass).Packets
		if passed != 0 || s1.Unselected.Packets != s0.Unselected.Packets {
			return 0, fmt.Errorf("tierlimit passed %d frames in a live run, want 0", passed)
		}
		if dropped < uint64(n) {
			return 0, fmt.Errorf("tierlimit dropped %d of %d live frames", dropped, n)
		}
		return dropped, nil
	}
	best := liveChunks(b, ns, h, frame, check, bare, touch)
	tl, br, tc := best[0], best[1], best[2]
	b.ReportMetric(tl, "Mpps")
	b.ReportMetric(br, "bare-Mpps")
	b.ReportMetric(tl/br, "x-bare")
	b.ReportMetric(tc, "touch-Mpps")
	b.ReportMetric(tc/br, "touch-x-bare")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkLiveFramesSmooth is BenchmarkLiveFrames for the smooth shape's
// drop path (docs/design.md §9): a flood far past the table, q(R̂) from the
// memoised closed form and a draw per frame, beside the ordinal drop path
// (a second limiter, saturated) and a bare XDP_DROP, chunk by chunk in the
// same run. It reports Mpps for each and x-ordinal (smooth over ordinal,
// higher is better). The smooth program passes a frame now and then (q < 1),
// into the stack of the benchmark's own namespace, where no socket waits.
func BenchmarkLiveFramesSmooth(b *testing.B) {
	sp := dropPolicy()
	sp.Shape = tiers.ShapeSmooth
	h := newHarness(b, sp)
	ord := newHarness(b, dropPolicy())
	bare := BareProgram(b, xdpDrop)
	frame := UDP4(b, 514)
	ns := NewNS(b)
	h.expire()
	h.repeat(frame, 1000)
	ord.expire()
	ord.repeat(frame, 1000)
	for _, p := range []*ebpf.Program{ord.l.Program(), bare} {
		if got, err := p.Run(&ebpf.RunOptions{Data: frame}); err != nil || got != xdpDrop {
			b.Fatalf("control program returns %d (%v), want XDP_DROP: refusing a live run", got, err)
		}
	}
	check := func(s0, s1 bpf.Stats, n uint32) (uint64, error) {
		judged := s1.SelectedPackets() - s0.SelectedPackets()
		if judged < uint64(n) {
			return 0, fmt.Errorf("smooth judged %d of %d live frames", judged, n)
		}
		return judged, nil
	}
	best := liveChunks(b, ns, h, frame, check, ord.l.Program(), bare)
	b.ReportMetric(best[0], "Mpps")
	b.ReportMetric(best[1], "ordinal-Mpps")
	b.ReportMetric(best[2], "bare-Mpps")
	b.ReportMetric(best[0]/best[1], "x-ordinal")
	b.ReportMetric(best[0]/best[2], "x-bare")
	b.ReportMetric(0, "ns/op")
}

// liveChunks runs h's program and then each of controls on frame in
// live-frames mode on lo of ns, chunk by chunk (benchTiming's chunk, sized
// to the host's tick; chunkRounds of them), and returns each program's best chunk in Mpps: tierlimit's
// first, then the controls' in order. check judges tierlimit's chunk of n
// frames from its stats before and after, and returns the frames that
// count for its rate (those it dropped).
func liveChunks(b *testing.B, ns *NS, h *harness, frame []byte, check func(s0, s1 bpf.Stats, n uint32) (uint64, error), controls ...*ebpf.Program) []float64 {
	b.Helper()
	best := make([]float64, 1+len(controls))
	chunk := benchTiming(b).Chunk
	err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		ctx := xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(lo.Attrs().Index)}
		for range chunkRounds(b.N, chunk) {
			n := uint32(chunk)
			s0, err := h.l.Stats()
			if err != nil {
				return err
			}
			d, err := runLive(h.l.Program(), frame, ctx, n)
			if err != nil {
				return fmt.Errorf("live run of tierlimit: %w", err)
			}
			s1, err := h.l.Stats()
			if err != nil {
				return err
			}
			counted, err := check(s0, s1, n)
			if err != nil {
				return err
			}
			best[0] = max(best[0], float64(counted)/float64(d.Nanoseconds())*1e3)
			for i, c := range controls {
				dc, err := runLive(c, frame, ctx, n)
				if err != nil {
					return fmt.Errorf("live run of control program %d: %w", i, err)
				}
				best[1+i] = max(best[1+i], float64(n)/float64(dc.Nanoseconds())*1e3)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return best
}

// touchProgram is XDP_DROP after reading the frame's IPv4 protocol and UDP
// destination port, as any program that selects by port must: the live
// frames benchmark's control for what reading the headers of a frame the
// kernel has just built costs, apart from anything tierlimit does.
func touchProgram(tb testing.TB) *ebpf.Program {
	tb.Helper()
	const udpDportEnd = 14 + 20 + 4 // Ethernet, IPv4 without options, UDP source and destination ports
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "touch",
		Type: ebpf.XDP,
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
			asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, udpDportEnd),
			asm.JGT.Reg(asm.R4, asm.R3, "out"),
			asm.LoadMem(asm.R5, asm.R2, 14+9, asm.Byte),    // IPv4 protocol
			asm.LoadMem(asm.R5, asm.R2, 14+20+2, asm.Half), // UDP destination port
			asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("out"),
			asm.Return(),
		},
		License: "GPL",
	})
	if err != nil {
		tb.Fatalf("load header-reading program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// runLive runs prog on repeat live frames built from frame, on the calling
// goroutine's (locked) thread and thus in its network namespace, and returns
// the wall time. SIGURG is blocked as in runExact: an interrupted live run
// is restarted whole by cilium/ebpf.
func runLive(prog *ebpf.Program, frame []byte, ctx xdpMD, repeat uint32) (time.Duration, error) {
	var block, old unix.Sigset_t
	block.Val[0] = 1 << (uint(unix.SIGURG) - 1)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &block, &old); err != nil {
		return 0, err
	}
	defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	start := time.Now()
	// In live mode the kernel reports no return value: the caller checks
	// verdicts beforehand and counters afterwards.
	_, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx, Repeat: repeat, Flags: testXDPLiveFrames})
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	return d, nil
}

// BenchmarkScaling measures how tierlimit scales from one CPU to two running
// at once, beside a bare XDP_DROP program measured the same way (how well the
// machine itself scales two test runs). Each worker is a locked thread pinned
// with sched_setaffinity (BPF_PROG_TEST_RUN's cpu field is EINVAL for XDP);
// the two are released together. Each round (chunkRounds of them) runs
// tierlimit on 1 and 2 CPUs and bare on 1 and 2 CPUs, each CPU a chunk
// (benchTiming's, sized to the host's tick), and each rate is the best
// round's: on a shared machine other jobs only ever slow a round
// down. selected-pass is below T_last, where every packet adds to the shared
// window count (one cache line); selected-drop is a saturated window, where
// packets count on their own CPU; unselected, the control, never reaches
// the window: no program that parses and looks up its policy scales better
// than it. Reported: Mpps on 1 and 2 CPUs,
// x-scaling (2-CPU over 1-CPU rate), bare-x-scaling, x-vs-bare (x-scaling
// over bare-x-scaling, paired in the run), contention-% (1 - x-vs-bare), and
// line-ns: what a packet costs each CPU on 2 CPUs over 1 CPU, beyond what the
// bare program's does, in ns (the price of the shared line per packet).
func BenchmarkScaling(b *testing.B) {
	cpus := twoCPUs(b)
	for _, path := range []struct {
		name  string
		p     tiers.Policy
		frame []byte
	}{
		// Tier 0 for 0.7 × benchPassMax packets: shared count, table lookup, stats.
		{"selected-pass", func() tiers.Policy { p := ordinalDefault(); p.Window, p.Max = time.Hour, benchPassMax; return p }(), UDP4(b, 514)},
		// Saturated: per-CPU overflow count, stats, drop.
		{"selected-drop", dropPolicy(), UDP4(b, 514)},
		// The control: parse, policy and selector lookups, per-CPU
		// stats, and no window at all.
		{"unselected", dropPolicy(), TCP4(b, 22, true, false)},
		// Per-source budgets on (docs/design.md §6), one source far over its
		// budget, as in a flood from one host: the sketch's plain reads,
		// the over-budget stats and the top table's entry, no window.
		{"sources-over", withSources(dropPolicy(), tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64}), UDP4(b, 514)},
		// The smooth shape's drop path: the per-CPU estimate, q(R̂) and a
		// draw per packet, counted per CPU past saturation.
		{"smooth-drop", smooth(dropPolicy()), UDP4(b, 514)},
		{"smooth-sources-over", smooth(withSources(dropPolicy(), tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64})), UDP4(b, 514)},
	} {
		b.Run(path.name, func(b *testing.B) {
			h := newHarness(b, path.p)
			bare := BareProgram(b, xdpDrop)
			frame := path.frame
			h.expire()
			h.run(UDP4(b, 514)) // opens the window
			overAll := func() uint64 {
				st := h.stats()
				return st.OverBudget[tiers.VerdictDrop].Packets + st.OverBudget[tiers.VerdictPass].Packets
			}
			c0, o0 := h.window().Count, overAll()
			chunk := benchTiming(b).Chunk
			n, rounds := uint32(chunk), chunkRounds(b.N, chunk)
			var one, two, bareOne, bareTwo float64
			for range rounds {
				for _, m := range []struct {
					prog *ebpf.Program
					cpus []int
					best *float64
				}{{h.l.Program(), cpus[:1], &one}, {h.l.Program(), cpus, &two}, {bare, cpus[:1], &bareOne}, {bare, cpus, &bareTwo}} {
					r, err := rate(m.prog, frame, n, m.cpus, benchTiming(b).Fixed)
					if err != nil {
						b.Fatal(err)
					}
					*m.best = max(*m.best, r)
				}
			}
			// Every packet is in the one window (none opens in an hour),
			// counted exactly whether on the shared count or per CPU.
			// Over budget, they are dropped and counted as such instead.
			ran, want, wantOver := 3*uint64(n)*uint64(rounds), uint64(0), uint64(0)
			switch path.name {
			case "unselected":
			case "sources-over", "smooth-sources-over":
				wantOver = ran
			default:
				want = ran
			}
			if got := h.window().Count - c0; got != want {
				b.Fatalf("window count grew by %d, want %d", got, want)
			}
			if got := overAll() - o0; got != wantOver {
				b.Fatalf("over-budget packets grew by %d, want %d", got, wantOver)
			}
			x, bx := two/one, bareTwo/bareOne
			b.ReportMetric(one, "1cpu-Mpps")
			b.ReportMetric(two, "2cpu-Mpps")
			b.ReportMetric(x, "x-scaling")
			b.ReportMetric(bx, "bare-x-scaling")
			b.ReportMetric(x/bx, "x-vs-bare")
			b.ReportMetric(100*(1-x/bx), "contention-%")
			b.ReportMetric((2e3/two-1e3/one)-(2e3/bareTwo-1e3/bareOne), "line-ns")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// rate runs prog on n packets on each of cpus at once (pinnedRuns) and
// returns the total rate in Mpps over the wall time from the release to
// the last finish, less fixed (a call's fixed cost, hostTiming.Fixed).
func rate(prog *ebpf.Program, frame []byte, n uint32, cpus []int, fixed time.Duration) (float64, error) {
	counts := make([]uint32, len(cpus))
	for i := range counts {
		counts[i] = n
	}
	d, err := pinnedRuns(prog, frame, cpus, counts)
	if err != nil {
		return 0, err
	}
	d = max(d-fixed, time.Microsecond)
	return float64(n) * float64(len(cpus)) / float64(d.Nanoseconds()) * 1e3, nil
}

// twoCPUs returns the first two CPUs the process may run on, skipping tb
// on a machine with fewer.
func twoCPUs(tb testing.TB) []int {
	tb.Helper()
	cpus, err := usableCPUs()
	if err != nil {
		tb.Fatal(err)
	}
	if len(cpus) < 2 {
		tb.Skipf("need 2 CPUs, have %v", cpus)
	}
	return cpus[:2]
}

// usableCPUs lists the CPUs this process may run on.
func usableCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for i := 0; i < 1024 && len(cpus) < set.Count(); i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// BenchmarkBarePass measures the two baselines of BenchmarkProgram against
// each other: a bare XDP_PASS program beside a bare XDP_DROP program, chunk
// by chunk on the same frame. BPF_PROG_TEST_RUN without live frames does
// not act on the verdict, so they should cost the same; the figure shows
// how much of "bare" is the test run itself.
func BenchmarkBarePass(b *testing.B) {
	Require(b)
	pass := BareProgram(b, xdpPass)
	drop := BareProgram(b, xdpDrop)
	benchPaired(b, benchProgs{prog: pass, bare: drop}, UDP4(b, 514))
}
