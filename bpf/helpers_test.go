package bpf_test

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/localaddr"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// XDP actions (include/uapi/linux/bpf.h enum xdp_action).
const (
	xdpDrop = 1
	xdpPass = 2
)

// harness is one loaded limiter with a policy applied.
type harness struct {
	tb  testing.TB
	l   *bpf.Limiter
	p   tiers.Policy
	tab tiers.Table
}

// newHarness loads the limiter as the agent does: with the tick gate on
// where the kernel's tick is known.
func newHarness(tb testing.TB, p tiers.Policy) *harness {
	tb.Helper()
	return newHarnessOpts(tb, p, bpf.Options{TickNs: kernelTick(tb)})
}

func kernelTick(tb testing.TB) uint64 {
	tick, err := bpf.KernelTick()
	if err != nil {
		tb.Logf("tick gate off: %v", err)
	}
	return tick
}

func newHarnessOpts(tb testing.TB, p tiers.Policy, opts bpf.Options) *harness {
	tb.Helper()
	testenv.Require(tb)
	l, err := bpf.Load(opts)
	if err != nil {
		tb.Fatal(err)
	}
	return newHarnessWith(tb, p, l)
}

// newHarnessWith is a harness on a loaded limiter l, which it closes at
// the end of the test, with policy p applied.
func newHarnessWith(tb testing.TB, p tiers.Policy, l *bpf.Limiter) *harness {
	tb.Helper()
	tb.Cleanup(func() { l.Close() })
	h := &harness{tb: tb, l: l}
	h.apply(p)
	return h
}

// compile compiles p for h's limiter (tiers.Compile with its tick).
func (h *harness) compile(p tiers.Policy) tiers.Table {
	h.tb.Helper()
	tab, err := tiers.Compile(p, h.l.Tick())
	if err != nil {
		h.tb.Fatalf("compile: %v", err)
	}
	return tab
}

func (h *harness) apply(p tiers.Policy) {
	h.tb.Helper()
	tab, err := tiers.Compile(p, h.l.Tick())
	if err != nil {
		h.tb.Fatalf("compile: %v", err)
	}
	if err := h.l.Apply(context.Background(), tab); err != nil {
		h.tb.Fatalf("apply: %v", err)
	}
	h.p, h.tab = p, tab
}

// run runs the program once on frame and returns the XDP action.
func (h *harness) run(frame []byte) uint32 {
	h.tb.Helper()
	ret, err := h.l.Program().Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		h.tb.Fatalf("run program on %d-byte frame: %v", len(frame), err)
	}
	return ret
}

// repeat runs the program n times on frame in one BPF_PROG_TEST_RUN.
func (h *harness) repeat(frame []byte, n uint32) uint32 {
	h.tb.Helper()
	ret, err := runExact(h.l.Program(), frame, n)
	if err != nil {
		h.tb.Fatalf("run program %d times: %v", n, err)
	}
	return ret
}

// runExact runs prog repeat times with SIGURG blocked on the calling
// thread. BPF_PROG_TEST_RUN with Repeat > 1 stops with EINTR when a signal
// is pending, and cilium/ebpf then runs the whole batch again, so the window
// would count some packets twice; the Go runtime's preemption signal, SIGURG,
// is the usual one. Blocking it keeps the count of a repeated run exact.
func runExact(prog *ebpf.Program, frame []byte, repeat uint32) (uint32, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var block, old unix.Sigset_t
	block.Val[0] = 1 << (uint(unix.SIGURG) - 1)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &block, &old); err != nil {
		return 0, err
	}
	defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	return prog.Run(&ebpf.RunOptions{Data: frame, Repeat: repeat})
}

func (h *harness) stats() bpf.Stats {
	h.tb.Helper()
	st, err := h.l.Stats()
	if err != nil {
		h.tb.Fatal(err)
	}
	return st
}

func (h *harness) window() bpf.Window {
	h.tb.Helper()
	w, err := h.l.Window()
	if err != nil {
		h.tb.Fatal(err)
	}
	return w
}

// preload makes the current window hold count packets, opened now, so the
// next selected packet has n = count+1. StartJiffies 0 keeps the window's
// packets on the exact clock path.
func (h *harness) preload(count uint64) {
	h.tb.Helper()
	w := h.window()
	w.StartNs, w.Count, w.StartJiffies = monotonicNow(h.tb), count, 0
	if err := h.l.SetWindow(w); err != nil {
		h.tb.Fatal(err)
	}
}

// expire backdates the window so that the next selected packet opens a new one.
func (h *harness) expire() {
	h.tb.Helper()
	w := h.window()
	w.StartNs = monotonicNow(h.tb) - uint64(h.p.Window) - uint64(time.Millisecond)
	w.StartJiffies = 0
	if err := h.l.SetWindow(w); err != nil {
		h.tb.Fatal(err)
	}
}

// monotonicNow is the clock bpf_ktime_get_ns reads, in ns
// (bpf.MonotonicNow).
func monotonicNow(tb testing.TB) uint64 {
	now, err := bpf.MonotonicNow()
	if err != nil {
		tb.Fatal(err)
	}
	return now
}

// testPolicy is the seed's default with a long window, an exempt prefix per
// family and a rule narrowed to destination prefixes.
func testPolicy(tb testing.TB) tiers.Policy {
	tb.Helper()
	p := ordinalDefault()
	p.Window = time.Hour
	p.Exempt = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:ee::/48")}
	p.Select = append(p.Select,
		tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 5514, Last: 5515}}, Dests: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::2/128")}},
		tiers.Rule{Proto: tiers.ProtoTCP, Ports: []tiers.PortRange{{First: 7000, Last: 7000}}, Dests: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Count: tiers.CountSYN},
	)
	if err := p.Validate(); err != nil {
		tb.Fatalf("test policy: %v", err)
	}
	return p
}

// sigmaBound is the 5-sigma half-width of a binomial proportion over n trials.
func sigmaBound(p float64, n int) float64 {
	return 5 * math.Sqrt(p*(1-p)/float64(n))
}

// ordinalDefault is the embedded default policy under the seed's ordinal
// shape (docs/design.md §2), the rule the exact tests of this package pin.
func ordinalDefault() tiers.Policy {
	p := tiers.Default()
	p.Shape = tiers.ShapeOrdinal
	return p
}

// waitLocalDests waits up to 3 s until ns's local destinations, as the
// agent reads them (localaddr.Dests), hold every prefix of want, and
// returns them.
func waitLocalDests(t *testing.T, ns *testenv.NS, want ...netip.Prefix) []tiers.LocalDest {
	t.Helper()
	var local []tiers.LocalDest
	if err := ns.Do(func() error {
		g, err := localaddr.OpenGroups()
		if err != nil {
			return err
		}
		defer g.Close()
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if local, err = localaddr.Dests(&netlink.Handle{}, g); err != nil {
				return err
			}
			pfx := localaddr.Prefixes(local)
			if !slices.ContainsFunc(want, func(w netip.Prefix) bool { return !slices.Contains(pfx, w) }) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("local destinations %v lack one of %v after 3 s", pfx, want)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	return local
}

// attachNative attaches l's program in native mode to the interface of
// ifindex in ns, until t ends.
func attachNative(t *testing.T, ns *testenv.NS, l *bpf.Limiter, ifindex int) {
	t.Helper()
	if err := ns.Do(func() error {
		lk, err := link.AttachXDP(link.XDPOptions{Program: l.Program(), Interface: ifindex, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { lk.Close() })
		return nil
	}); err != nil {
		t.Fatalf("attach in native mode to ifindex %d in %s: %v", ifindex, ns.Name, err)
	}
}
