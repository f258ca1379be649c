package bpf_test

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// concurrently runs h's program on frame counts[i] times on cpus[i], all
// CPUs at once (pinnedRuns).
func concurrently(h *harness, frame []byte, cpus []int, counts []uint32) error {
	_, err := pinnedRuns(h.l.Program(), frame, cpus, counts)
	return err
}

// pinnedRuns runs prog on frame counts[i] times on cpus[i], all CPUs at
// once: a locked thread each, pinned with sched_setaffinity, released
// together. It returns the wall time from the release to the last finish.
func pinnedRuns(prog *ebpf.Program, frame []byte, cpus []int, counts []uint32) (time.Duration, error) {
	var (
		ready, done sync.WaitGroup
		start       = make(chan struct{})
		mu          sync.Mutex
		last        time.Time
		errs        []error
	)
	for i, cpu := range cpus {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			// The thread's affinity is never restored: it stays locked,
			// so the runtime ends it with this goroutine.
			runtime.LockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			err := unix.SchedSetaffinity(0, &set)
			ready.Done()
			<-start
			if err == nil {
				_, err = runExact(prog, frame, counts[i])
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
	return last.Sub(t0), errors.Join(errs...)
}

// modelCounts runs model.Model over n packets of one window and returns,
// per tier, the packets and the expected drops and their variance.
func modelCounts(h *harness, n uint64) (packets []uint64, drops, variance []float64) {
	k := len(h.tab.Drops)
	packets, drops, variance = make([]uint64, k), make([]float64, k), make([]float64, k)
	m := model.NewModel(h.p, h.tab, func() uint32 { return 0 })
	for range n {
		d := m.Packet(1)
		packets[d.Tier]++
	}
	for t := range k {
		p := tiers.DropRatio(h.tab.Drops[t])
		drops[t] = float64(packets[t]) * p
		variance[t] = float64(packets[t]) * p * (1 - p)
	}
	return packets, drops, variance
}

// TestSaturatedWindowTwoCPUs runs 4×10^6 packets of one 60 s window on two
// pinned CPUs at once, with max 10^6, so that both CPUs cross every
// threshold, T_last included, mid-run: below T_last every packet takes the
// shared count, past it the per-CPU overflow. Every packet is counted once
// (stats and window), each tier holds exactly the packets model.Model puts
// there, the 0% and 100% tiers' verdicts are exact and the random tiers'
// drops are within 5σ of the model's; the window's count, and then its
// final count as last_window_packets, are exact; and the shared count
// stopped within a packet per CPU of T_last (the fast path was taken).
func TestSaturatedWindowTwoCPUs(t *testing.T) {
	cpus := twoCPUs(t)
	p := ordinalDefault()
	p.Window, p.Max = time.Minute, 1_000_000
	h := newHarness(t, p)
	frame := UDP4(t, 514)
	const total = 4_000_000

	h.expire()
	h.run(frame) // opens the window: n = 1, counted in total
	if err := concurrently(h, frame, cpus, []uint32{total/2 - 1, total / 2}); err != nil {
		t.Fatal(err)
	}
	st := h.stats()
	w := h.window()

	if got := st.SelectedPackets(); got != total {
		t.Fatalf("stats count %d selected packets, ran %d", got, total)
	}
	if w.Count != total {
		t.Fatalf("window count %d, ran %d packets in it", w.Count, total)
	}
	lastN := h.tab.TierStart(len(h.tab.Bounds))
	if shared := w.Count - w.Overflow; shared > lastN+uint64(len(cpus)) {
		t.Fatalf("shared count %d (overflow %d): the fast path was not taken past last_n %d", shared, w.Overflow, lastN)
	}

	packets, drops, variance := modelCounts(h, total)
	for tier := range packets {
		c := st.Selected[tier]
		pass, drop := c[tiers.VerdictPass].Packets, c[tiers.VerdictDrop].Packets
		if pass+drop != packets[tier] {
			t.Errorf("tier %d: %d packets, model %d", tier, pass+drop, packets[tier])
		}
		ratio := tiers.DropRatio(h.tab.Drops[tier])
		switch {
		case ratio == 0 && drop != 0, ratio == 1 && pass != 0:
			t.Errorf("tier %d (drop ratio %v): %d passed, %d dropped", tier, ratio, pass, drop)
		case math.Abs(float64(drop)-drops[tier]) > 5*math.Sqrt(variance[tier]):
			t.Errorf("tier %d: %d dropped, model %.0f ± %.0f (5σ)", tier, drop, drops[tier], 5*math.Sqrt(variance[tier]))
		}
		t.Logf("tier %d: %d packets (model %d), %d dropped (model %.0f ± %.0f)", tier, pass+drop, packets[tier], drop, drops[tier], 5*math.Sqrt(variance[tier]))
	}

	// The next window: the last one's count, overflow included, is exact.
	h.expire()
	h.run(frame)
	w2 := h.window()
	if w2.LastCount != total || w2.Count != 1 || w2.Opened != w.Opened+1 {
		t.Fatalf("next window: last count %d, count %d, opened %d; want %d, 1, %d", w2.LastCount, w2.Count, w2.Opened, total, w.Opened+1)
	}
}

// TestSaturationBoundary checks packets n = last_n - 1, last_n and last_n +
// 1 (last_n: the first n of the table's last entry), one at a time: each
// lands in the tier that tiers.Table.Lookup gives, the window counts each
// exactly, and from last_n on the packet is counted on its CPU's overflow.
// Policies with a table at step 1 and at a coarser step, and with a last
// tier that draws (50%).
func TestSaturationBoundary(t *testing.T) {
	half := ordinalDefault()
	half.Tiers[len(half.Tiers)-1].Drop = tiers.Pct(50)
	for _, c := range []struct {
		name string
		p    tiers.Policy
		max  uint64
	}{{"step1", ordinalDefault(), 40000}, {"coarse", ordinalDefault(), 100_000_003}, {"last50", half, 40000}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // a program each, an hour-long window
			p := c.p
			p.Window, p.Max = time.Hour, c.max
			h := newHarness(t, p)
			frame := UDP4(t, 514)
			lastN := h.tab.TierStart(len(h.tab.Bounds))
			h.preload(lastN - 2)
			for _, n := range []uint64{lastN - 1, lastN, lastN + 1} {
				s0 := h.stats()
				h.run(frame)
				s1, w := h.stats(), h.window()
				wantTier, _ := h.tab.Lookup(n)
				tier := -1
				for k := range s1.Selected {
					if s1.Selected[k] != s0.Selected[k] {
						tier = k
					}
				}
				if tier != wantTier {
					t.Errorf("n=%d: tier %d, table says %d", n, tier, wantTier)
				}
				if w.Count != n {
					t.Errorf("n=%d: window count %d", n, w.Count)
				}
				if want := n - min(n, lastN-1); w.Overflow != want {
					t.Errorf("n=%d: overflow %d, want %d", n, w.Overflow, want)
				}
			}
		})
	}
}

// TestReloadKeepsSaturatedCount saturates a window (max 1000), then applies
// a policy whose last threshold is far higher: the packets counted per CPU
// past the old last_n still count, so the next packet has the exact n of
// the window and the tier the new policy gives that n.
func TestReloadKeepsSaturatedCount(t *testing.T) {
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, 1000
	h := newHarness(t, p)
	frame := UDP4(t, 514)
	h.expire()
	h.repeat(frame, 5000)
	if w := h.window(); w.Count != 5000 || w.Overflow == 0 {
		t.Fatalf("window count %d, overflow %d after 5000 packets at max 1000", w.Count, w.Overflow)
	}
	// The new policy: tier 1 (0%) from 5000, tier 2 (100%) from 10000. With
	// n from the shared count alone (about 1000) the packet would be tier 0.
	p.Max = 10000
	p.Tiers = []tiers.Tier{{At: tiers.Pct(50), Drop: tiers.Pct(0)}, {At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	h.apply(p)
	s0 := h.stats()
	h.repeat(frame, 4999) // n = 5001 .. 9999
	s1 := h.stats()
	if got := s1.Selected[1][tiers.VerdictPass].Packets - s0.Selected[1][tiers.VerdictPass].Packets; got != 4999 {
		t.Fatalf("n 5001..9999 after the reload: %d in tier 1, want 4999", got)
	}
	if ret := h.run(frame); ret != xdpDrop {
		t.Fatalf("n=10000 after the reload: action %d, want drop", ret)
	}
	if w := h.window(); w.Count != 10000 {
		t.Fatalf("window count %d, want 10000", w.Count)
	}
}
