package bpf_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// pinCPU runs the calling goroutine on CPU cpu (modulo the CPUs) until
// the test ends: the smooth shape's onset is latched per CPU (smooth.h
// sm_latch), and model.Model is one CPU's, so a paced comparison of the
// two runs its packets on one CPU; a thread that moves finds the other
// CPU's memo stale, and that CPU starts its rate again.
func pinCPU(t *testing.T, cpu int) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	var set unix.CPUSet
	set.Set(cpu % runtime.NumCPU())
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
}

// stepPaced paces frames (in turn) through the program in real time
// (BPF_PROG_TEST_RUN, 1 ms steps of a testenv.Pacer) at lo packets per
// window for three windows of the schedule and then until the program's
// window is phi elapsed, then at hi for stepSpan more. It returns each
// packet's clock (CLOCK_MONOTONIC read just before its run), whether it
// passed, the step's clock, and the pacer. Bounded by six windows.
func stepPaced(t *testing.T, h *harness, frames [][]byte, window time.Duration, lo, hi, phi float64) ([]uint64, []bool, uint64, *testenv.Pacer) {
	t.Helper()
	pc := testenv.NewPacer(window, 6)
	var ts []uint64
	var pass []bool
	var step uint64
	var stepAt time.Duration
	var sent, due float64
	last := time.Duration(0)
	for el := pc.Now(); el < pc.Span(); el = pc.Now() {
		if step == 0 && el >= 3*window {
			now := monotonicNow(t)
			if w := h.window(); float64(now-w.StartNs) >= phi*float64(window) {
				step, stepAt = now, el
			}
		}
		rate := lo
		if step != 0 {
			rate = hi
			if el >= stepAt+window*3/2 {
				break
			}
		}
		due += rate * float64(el-last) / float64(window)
		last = el
		for ; sent < due; sent++ {
			ts = append(ts, monotonicNow(t))
			pass = append(pass, h.run(frames[(len(ts)-1)%len(frames)]) == xdpPass)
		}
		pc.Sleep()
	}
	return ts, pass, step, pc
}

// Property 3 in the program (docs/design.md §9, issue 39): from a steady
// 0.5 × max, a step to 10 × max at a phase φ ∈ {0.3, 0.6, 0.9} of the
// program's window, paced in real time, without budgets and with budgets
// (64 sources, each within its budget before the step and over it
// after). The window-long span from the step passes at most 1.25 ×
// P(R) of what it was really offered, and the program passes what
// model.Model passes on the same packets at the same clock reads within
// 5 of its standard deviations over 100 seeds, in that span and in the
// windows before it. Before issue 39 a step after mid-window was never an
// onset: the span passed about 2 to 3 × P(R).
//
// max is stepMax, 1200 packets a window: the span's pass count is a
// random draw with a standard deviation of about 5 % of P(R) at 300 and
// 2.7 % at 1200, so at 1200 the single-run bound lies about 8 of them
// above the model's mean instead of 4, and a run a few σ above the
// model's mean (+3.8σ once in CI at 300; a model fed the clock read after
// each run, not before, gives the same mean) is still judged on the rule,
// not on its luck.
func TestSmoothStepProgram(t *testing.T) {
	const window = 500 * time.Millisecond
	const stepMax = 1200
	srcs := make([]netip.Addr, 64)
	for i := range srcs {
		srcs[i] = netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})
	}
	cpu := 0
	for _, budgets := range []bool{false, true} {
		for _, phi := range []float64{0.3, 0.6, 0.9} {
			cpu++
			name := fmt.Sprintf("phi%.1f", phi)
			if budgets {
				name += "-budgets"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				pinCPU(t, cpu)
				p := tiers.Default()
				p.Window, p.Max = window, stepMax
				if budgets {
					p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
				}
				h := newHarnessOpts(t, p, bpf.Options{})
				h.expire()
				frames := make([][]byte, len(srcs))
				for i, s := range srcs {
					frames[i] = udpFrom(t, s)
				}
				ts, pass, step, pc := stepPaced(t, h, frames, window, 0.5*float64(p.Max), 10*float64(p.Max), phi)
				if step == 0 {
					t.Fatal("the schedule ended before the step")
				}
				k := int(time.Duration(step-ts[0]) / window)
				if !pc.Judged(t, min(k, 5)) || !pc.Judged(t, min(k+1, 5)) {
					return
				}
				end := step + uint64(window)
				var offered, got float64
				for i, at := range ts {
					if at >= step && at < end {
						offered++
						if pass[i] {
							got++
						}
					}
				}
				tab := h.compile(p)
				pr := tab.Expected(uint64(offered)).Passed
				const seeds = 100
				var sum, sq float64
				for seed := range uint64(seeds) {
					m := model.NewModel(p, tab, rand.New(rand.NewPCG(seed, seed+1)).Uint32)
					m.SetTick(h.l.TickNs())
					m.SetSketchSeeds(h.l.SketchSeeds())
					var x float64
					for i, at := range ts {
						if m.PacketFrom(at, srcs[i%len(srcs)]).Verdict == tiers.VerdictPass && at >= step && at < end {
							x++
						}
					}
					sum += x
					sq += x * x
				}
				mean := sum / seeds
				sd := math.Sqrt(max(0, sq/seeds-mean*mean))
				t.Logf("step at φ %.1f: the span from it offered %.0f, program passed %.0f (%.3f × P(R) %.1f), model %.1f ± %.1f (%+.1fσ)",
					phi, offered, got, got/pr, pr, mean, sd, (got-mean)/max(sd, 1))
				if got > 1.25*pr {
					t.Errorf("the span from the step passed %.0f, %.3f × P(R), want ≤ 1.25", got, got/pr)
				}
				if math.Abs(got-mean) > 5*sd+2 {
					t.Errorf("the span from the step: program passed %.0f, model %.1f ± 5 × %.1f", got, mean, sd)
				}
			})
		}
	}
}
