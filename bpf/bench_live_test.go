package bpf_test

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// testXDPLiveFrames is BPF_F_TEST_XDP_LIVE_FRAMES (include/uapi/linux/bpf.h):
// BPF_PROG_TEST_RUN builds a real xdp_frame for every repetition and carries
// out the verdict (XDP_PASS goes to the stack of the ingress device, XDP_TX
// out of it), so the cost includes frame setup and the page pool recycling
// of a dropped frame, as on a driver's receive path. Linux >= 5.18.
const testXDPLiveFrames = 1 << 1

// liveChunk is the most frames of one live-frames BPF_PROG_TEST_RUN call.
const liveChunk = 1 << 22

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
// after preloading the window past 100 every selected packet is in the
// 100% tier and is dropped without a draw. The window is an hour long.
func dropPolicy() tiers.Policy {
	p := tiers.Default()
	p.Window, p.Max = time.Hour, 100
	return p
}

// BenchmarkLiveFrames measures, in live-frames mode, the packet rate of
// tierlimit on its drop path (window saturated, 100% tier) beside a bare
// XDP_DROP program, chunk by chunk on the same frame in the same run. It
// reports Mpps for both and their ratio (x-bare, higher is better for
// tierlimit). Frames are injected on lo of a network namespace that the
// benchmark creates and removes; both programs are checked to drop the frame
// before any live run, so no frame reaches a stack. Mpps is from wall time
// around each call, with the Go runtime's preemption signal blocked so that
// no call is restarted.
func BenchmarkLiveFrames(b *testing.B) {
	h := newHarness(b, dropPolicy())
	bare := BareProgram(b, xdpDrop)
	frame := UDP4(b, 514)
	ns := NewNS(b)

	// Safety: both programs must drop this frame before it is run live.
	h.preload(1_000_000)
	if got := h.run(frame); got != xdpDrop {
		b.Fatalf("tierlimit returns %d on the benchmark frame, want XDP_DROP (%d): refusing a live run", got, xdpDrop)
	}
	if got, err := bare.Run(&ebpf.RunOptions{Data: frame}); err != nil || got != xdpDrop {
		b.Fatalf("bare program returns %d (%v), want XDP_DROP: refusing a live run", got, err)
	}
	h.preload(1_000_000)

	var tlNs, bareNs, tlPkts, barePkts float64
	err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		ctx := xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(lo.Attrs().Index)}
		for done := 0; done < b.N; done += liveChunk {
			n := uint32(min(liveChunk, b.N-done))
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
			dropped := s1.SelectedTotal(tiers.VerdictDrop).Packets - s0.SelectedTotal(tiers.VerdictDrop).Packets
			passed := s1.SelectedTotal(tiers.VerdictPass).Packets - s0.SelectedTotal(tiers.VerdictPass).Packets
			if passed != 0 || s1.Unselected.Packets != s0.Unselected.Packets {
				return fmt.Errorf("tierlimit passed %d frames in a live run, want 0", passed)
			}
			if dropped < uint64(n) {
				return fmt.Errorf("tierlimit dropped %d of %d live frames", dropped, n)
			}
			db, err := runLive(bare, frame, ctx, n)
			if err != nil {
				return fmt.Errorf("live run of bare XDP_DROP: %w", err)
			}
			tlNs += float64(d.Nanoseconds())
			tlPkts += float64(dropped)
			bareNs += float64(db.Nanoseconds())
			barePkts += float64(n)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	tl, br := tlPkts/tlNs*1e3, barePkts/bareNs*1e3
	b.ReportMetric(tl, "Mpps")
	b.ReportMetric(br, "bare-Mpps")
	b.ReportMetric(tl/br, "x-bare")
	b.ReportMetric(0, "ns/op")
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

// BenchmarkScaling measures how the selected path scales from one CPU to two
// running at once, all packets going through the one shared window counter
// (an atomic add on a single cache line). Each worker is a locked thread
// pinned with sched_setaffinity (BPF_PROG_TEST_RUN's cpu field is EINVAL for
// XDP) that runs b.N packets in one call. A bare XDP_DROP program measured
// the same way is the control: it shows how well the machine itself scales
// two test runs. Reported: Mpps on 1 and 2 CPUs, x-scaling (2-CPU over
// 1-CPU rate, the target is >= 1.8), bare-x-scaling, and contention-% (how
// much of the bare program's scaling the shared counter costs).
func BenchmarkScaling(b *testing.B) {
	cpus := twoCPUs(b)
	for _, path := range []struct {
		name string
		p    tiers.Policy
	}{
		// Tier 0 for 7*10^7 packets: count, table lookup, stats.
		{"selected-pass", func() tiers.Policy { p := tiers.Default(); p.Window, p.Max = time.Hour, 100_000_000; return p }()},
		// Saturated: count, table lookup, stats, drop.
		{"selected-drop", dropPolicy()},
	} {
		b.Run(path.name, func(b *testing.B) {
			h := newHarness(b, path.p)
			bare := BareProgram(b, xdpDrop)
			frame := UDP4(b, 514)
			h.expire()
			n := uint32(b.N)
			one, err := rate(h.l.Program(), frame, n, cpus[:1])
			if err != nil {
				b.Fatal(err)
			}
			c0 := h.window().Count
			two, err := rate(h.l.Program(), frame, n, cpus)
			if err != nil {
				b.Fatal(err)
			}
			// Every packet of both CPUs is in the one count (no window
			// opens in an hour): the counter is exact under contention.
			if got := h.window().Count - c0; got != 2*uint64(n) {
				b.Fatalf("window count grew by %d over 2 CPUs × %d packets", got, n)
			}
			bareOne, err := rate(bare, frame, n, cpus[:1])
			if err != nil {
				b.Fatal(err)
			}
			bareTwo, err := rate(bare, frame, n, cpus)
			if err != nil {
				b.Fatal(err)
			}
			x, bx := two/one, bareTwo/bareOne
			b.ReportMetric(one, "1cpu-Mpps")
			b.ReportMetric(two, "2cpu-Mpps")
			b.ReportMetric(x, "x-scaling")
			b.ReportMetric(bx, "bare-x-scaling")
			b.ReportMetric(100*(1-x/bx), "contention-%")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// rate runs prog on n packets on each of cpus at once, one pinned thread
// per CPU released together, and returns the total rate in Mpps over the
// wall time from the release to the last finish.
func rate(prog *ebpf.Program, frame []byte, n uint32, cpus []int) (float64, error) {
	var (
		ready, done sync.WaitGroup
		start       = make(chan struct{})
		mu          sync.Mutex
		last        time.Time
		errs        []error
	)
	for _, cpu := range cpus {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			// The thread's affinity is changed and never restored: it
			// stays locked, so the runtime ends it with this goroutine.
			runtime.LockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			err := unix.SchedSetaffinity(0, &set)
			ready.Done()
			<-start
			if err == nil {
				_, err = runExact(prog, frame, n)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("cpu %d: %w", cpu, err))
			}
			if now := time.Now(); now.After(last) {
				last = now
			}
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	done.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return float64(n) * float64(len(cpus)) / float64(last.Sub(t0).Nanoseconds()) * 1e3, nil
}

// usableCPUs lists the CPUs this process may run on.
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
	benchPaired(b, pass, drop, UDP4(b, 514))
}

// counterProgs builds the two counters of the scaling proposal as minimal
// XDP programs that count every packet and drop it: "shared", one atomic
// add per packet on one shared u64 (what limiter.c does with the window
// count), and "batched", a per-CPU pending count flushed into the shared
// u64 with one atomic add every k packets, each packet reading the shared
// count to form its n (shared + pending). Slot 1 of the per-CPU value
// keeps the last n, so the read is not dead code.
func counterProgs(tb testing.TB, k int32) (shared, batched *ebpf.Program, sharedMap, pendingMap *ebpf.Map) {
	tb.Helper()
	var err error
	sharedMap, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sharedMap.Close() })
	pendingMap, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pendingMap.Close() })
	lookup := func(m *ebpf.Map) asm.Instructions {
		return asm.Instructions{
			asm.StoreImm(asm.R10, -4, 0, asm.Word),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.R10),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
		}
	}
	out := asm.Instructions{asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("out"), asm.Return()}
	load := func(name string, insns asm.Instructions) *ebpf.Program {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.XDP, Instructions: insns, License: "GPL"})
		if err != nil {
			tb.Fatalf("load %s: %v", name, err)
		}
		tb.Cleanup(func() { p.Close() })
		return p
	}
	var a asm.Instructions
	a = append(a, lookup(sharedMap)...)
	a = append(a, asm.Mov.Imm(asm.R1, 1), asm.StoreXAdd(asm.R0, asm.R1, asm.DWord))
	a = append(a, out...)
	var b asm.Instructions
	b = append(b, lookup(pendingMap)...)
	b = append(b,
		asm.Mov.Reg(asm.R6, asm.R0),
		asm.LoadMem(asm.R7, asm.R6, 0, asm.DWord),
		asm.Add.Imm(asm.R7, 1),
		asm.StoreMem(asm.R6, 0, asm.R7, asm.DWord),
	)
	b = append(b, lookup(sharedMap)...)
	b = append(b,
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Reg(asm.R1, asm.R7),
		asm.StoreMem(asm.R6, 8, asm.R1, asm.DWord),
		asm.JLT.Imm(asm.R7, k, "out"),
		asm.Mov.Imm(asm.R1, k),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(asm.R6, 0, asm.R1, asm.DWord),
	)
	b = append(b, out...)
	return load("tl_shared", a), load("tl_batched", b), sharedMap, pendingMap
}

// batchK is the flush interval of the batched counter prototype.
const batchK = 32

// BenchmarkCounterScaling measures the counter alone, on 1 CPU and on 2 at
// once, for the shared atomic count and for the per-CPU batched count of
// the proposal in results.md, beside bare XDP_DROP. It is a prototype to
// size the proposal, not the limiter.
func BenchmarkCounterScaling(b *testing.B) {
	Require(b)
	cpus := twoCPUs(b)
	shared, batched, _, _ := counterProgs(b, batchK)
	bare := BareProgram(b, xdpDrop)
	frame := UDP4(b, 514)
	n := uint32(b.N)
	scaling := func(p *ebpf.Program) float64 {
		one, err := rate(p, frame, n, cpus[:1])
		if err != nil {
			b.Fatal(err)
		}
		two, err := rate(p, frame, n, cpus)
		if err != nil {
			b.Fatal(err)
		}
		return two / one
	}
	xs, xb, x0 := scaling(shared), scaling(batched), scaling(bare)
	b.ReportMetric(xs, "shared-x-scaling")
	b.ReportMetric(xb, "batched-x-scaling")
	b.ReportMetric(x0, "bare-x-scaling")
	b.ReportMetric(0, "ns/op")
}

// TestBatchedCounterBound checks the prototype's error bound: after C CPUs
// run concurrently, the shared count lags the packets counted by exactly
// the unflushed ones, at most C(k-1), and no packet's n (shared + its own
// CPU's pending) ever exceeded the true count.
func TestBatchedCounterBound(t *testing.T) {
	Require(t)
	cpus, err := usableCPUs()
	if err != nil {
		t.Fatal(err)
	}
	_, batched, sharedMap, pendingMap := counterProgs(t, batchK)
	frame := UDP4(t, 514)
	const n = 100_003 // not a multiple of k: every CPU keeps a remainder
	if _, err := rate(batched, frame, n, cpus); err != nil {
		t.Fatal(err)
	}
	var shared uint64
	if err := sharedMap.Lookup(uint32(0), &shared); err != nil {
		t.Fatal(err)
	}
	var per [][2]uint64
	if err := pendingMap.Lookup(uint32(0), &per); err != nil {
		t.Fatal(err)
	}
	var pending uint64
	for _, v := range per {
		pending += v[0]
	}
	total := uint64(n) * uint64(len(cpus))
	if shared+pending != total {
		t.Fatalf("shared %d + pending %d = %d, want %d: packets lost or counted twice", shared, pending, shared+pending, total)
	}
	if bound := uint64(len(cpus)) * (batchK - 1); total-shared > bound {
		t.Fatalf("shared count lags by %d, bound C(k-1) = %d", total-shared, bound)
	}
	for i, v := range per {
		if v[1] > total {
			t.Errorf("cpu %d: last n %d exceeds the true count %d", i, v[1], total)
		}
	}
}
