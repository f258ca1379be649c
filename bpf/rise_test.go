package bpf_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// riseRun paces frames (in turn, with their sources srcs) through the
// program in real time at lo packets per window for step windows of wall
// clock, then at hi, for windows windows in all (1 ms batches,
// BPF_PROG_TEST_RUN). It returns each packet's clock (CLOCK_MONOTONIC, ns,
// read just before its run: the program's own read is within
// microseconds of it) and whether it passed. The loop is bounded by
// windows × window.
func riseRun(t *testing.T, h *harness, frames [][]byte, window time.Duration, lo, hi float64, step, windows int) ([]uint64, []bool) {
	t.Helper()
	var ts []uint64
	var pass []bool
	start := time.Now()
	var sent float64
	for el := time.Since(start); el < time.Duration(windows)*window; el = time.Since(start) {
		w := float64(el) / float64(window)
		due := lo * min(w, float64(step))
		if w > float64(step) {
			due += hi * (w - float64(step))
		}
		for ; sent < due; sent++ {
			ts = append(ts, monotonicNow(t))
			pass = append(pass, h.run(frames[(len(ts)-1)%len(frames)]) == xdpPass)
		}
		time.Sleep(time.Millisecond - time.Since(start)%time.Millisecond)
	}
	return ts, pass
}

// TestSmoothRiseProgram: the program against model.Model on rising loads
// (docs/design.md §9, properties 1 and 3), on the same packets at the same
// clock. The load steps from lo to hi × max after three windows. Each
// window's passes are held to the model's mean over 200 seeds within 5 of
// its standard deviations (the program is one draw of the same law), and
// the sum of every window's difference to 5 of the pooled deviation,
// which a bias of a few percent in every window fails where no single
// window would.
//
// An exact doubling (5× → 10×, the demo's schedule) sits on the onset
// rule's threshold (SmoothCoef.Onset, F > 2 S): whether the rise's window
// is an onset then turns on a few packets, and the program, whose CPUs
// sum each other's counts once a tick, and the model, which counts
// exactly, may fall on either side of it; the window passes the onset's
// share or the sliding count's, 0.7 or 1.0 × P(R), both within the
// contract. That window is logged, not judged; every other window of the
// schedule is.
//
// With budgets on, the packets come from 64 sources, each within its
// budget before the rise and over it after: the in-budget count's rate
// estimate (docs/design.md §6) is judged on the rise (3× → 10×, an onset
// by far; 6× → 10×, by far no onset), and past 6.4 × max the in-budget
// count passes max, so the window saturates. There the program judged its
// over-budget packets on last_n − 1 in-budget packets (smooth.h
// over_budget_thr read the saturated shared count without the CPUs'
// overflow), and passed 1.45 × P(R) from the second window at 10 × max,
// where the model passes its in-budget packets only.
func TestSmoothRiseProgram(t *testing.T) {
	const window = 500 * time.Millisecond
	srcs := make([]netip.Addr, 64)
	for i := range srcs {
		srcs[i] = netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})
	}
	cpu := 0
	for _, c := range []struct {
		lo, hi  float64
		budgets bool
		edge    bool // an exact doubling: the rise's window is not judged
	}{{5, 10, false, true}, {2, 10, false, false}, {10, 25, false, false}, {3, 10, true, false}, {6, 10, true, false}} {
		name := fmt.Sprintf("%g-%gx", c.lo, c.hi)
		if c.budgets {
			name += "-budgets"
		}
		cpu++
		t.Run(name, func(t *testing.T) {
			// The cases two at a time: each judges the program against
			// the model on the same packets at the same clock reads, so
			// a pacer that falls behind changes both alike; each on one
			// CPU, as the model's latch is one CPU's (pinCPU).
			t.Parallel()
			pinCPU(t, cpu)
			p := tiers.Default()
			p.Window, p.Max = window, 300
			if c.budgets {
				p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
			}
			// The tick gate off: every packet reads the clock, whose
			// ticks (clock >> TL_SMOOTH_TICK_SHIFT) the model counts
			// from the same clock.
			h := newHarnessOpts(t, p, bpf.Options{})
			h.expire()
			frames := make([][]byte, len(srcs))
			for i, s := range srcs {
				frames[i] = udpFrom(t, s)
			}
			ts, pass := riseRun(t, h, frames, window, c.lo*float64(p.Max), c.hi*float64(p.Max), 3, 7)
			tab := h.compile(p)
			const seeds = 200
			var got, sum, sq []float64
			for seed := range uint64(seeds) {
				m := model.NewModel(p, tab, rand.New(rand.NewPCG(seed, seed+1)).Uint32)
				m.SetTick(h.l.TickNs())
				m.SetSketchSeeds(h.l.SketchSeeds())
				var per []float64
				for i, now := range ts {
					d := m.PacketFrom(now, srcs[i%len(srcs)])
					if d.WindowOpened {
						per = append(per, 0)
					}
					if d.Verdict == tiers.VerdictPass {
						per[len(per)-1]++
					}
					if seed == 0 {
						if d.WindowOpened {
							got = append(got, 0)
						}
						if pass[i] {
							got[len(got)-1]++
						}
					}
				}
				for len(sum) < len(per) {
					sum, sq = append(sum, 0), append(sq, 0)
				}
				for k, v := range per {
					sum[k] += v
					sq[k] += v * v
				}
			}
			// The last window is cut short by the run's end: it is
			// judged as the others, on the packets it had.
			var diff, pooled float64
			for k := range got {
				mean := sum[k] / seeds
				sd := math.Sqrt(max(0, sq[k]/seeds-mean*mean))
				t.Logf("window %d: program passed %.0f, model %.1f ± %.1f (%+.1fσ)", k, got[k], mean, sd, (got[k]-mean)/max(sd, 1))
				if c.edge && k == 3 {
					continue // the rise's window, on the onset rule's edge
				}
				if math.Abs(got[k]-mean) > 5*sd+2 {
					t.Errorf("window %d: program passed %.0f, model %.1f ± 5 × %.1f", k, got[k], mean, sd)
				}
				diff += got[k] - mean
				pooled += sd * sd
			}
			if math.Abs(diff) > 5*math.Sqrt(pooled)+2 {
				t.Errorf("over %d windows the program passed %+.0f against the model, want within 5 × %.1f", len(got), diff, math.Sqrt(pooled))
			}
		})
	}
}

// A fleet member's report of its in-budget R̂ (docs/design.md §12,
// bpf.Limiter.FleetEstimate) reads the previous window's in-budget
// profile, as its own judging does (docs/design.md §6): 64 sources each at
// 1.56 × its budget, steady for three windows, then read 40 % into the
// fourth. The program's R̂_in is the model's EstimateAt on the same packets
// within 3 %, the model read at the clock either side of the program's
// read (R̂ falls as the clock runs on with no packet), and near the true
// in-budget count (64 × 30 = 1,920, within 10 %), where the even spread
// reads it high (logged).
//
// Both hold for steady traffic only. A pacer descheduled for a few
// milliseconds offers the missed packets in one burst, which the onset
// rule rightly reads as a surge (docs/design.md §9): R̂_in is then the
// burst's rate, up to tens of thousands, on the rule's edge, where the
// program and the model may fall on either side of it (TestSmoothRiseProgram;
// CI's failure of 76934da: 2,962 against 1,908); a gap without a latch
// moves the in-budget packets in time, and the profile with them (up to
// 1,575 where the program and the model agreed). A run with a gap of over
// 15 ms between packets from two windows before the window's start on,
// or with the model latched, is not steady: it is logged and run again;
// the test fails when three runs in a row were not, as testenv.Pacer fails
// a busy machine. Steady runs here have gaps of 1-5 ms. The loop runs
// on one CPU, as the model's latch is one CPU's (pinCPU).
func TestFleetEstimateProfile(t *testing.T) {
	pinCPU(t, 0)
	const runs = 3
	for run := range runs {
		if fleetEstimateProfile(t) {
			return
		}
		t.Logf("run %d of %d: the offered traffic was not steady (a gap of over 15 ms, or a burst the model latched as an onset): the in-budget count not judged", run+1, runs)
	}
	t.Errorf("%d runs in a row were not steady: the machine was too busy for the test to mean anything", runs)
}

// fleetEstimateProfile is one run of TestFleetEstimateProfile on a fresh
// program. It reports whether the run was steady (no gap between packets
// over maxGap, the model unlatched), and judges it only then.
func fleetEstimateProfile(t *testing.T) bool {
	t.Helper()
	const window = 500 * time.Millisecond
	p := fleetPolicyBPF(t, 300, window)
	p.Sources = tiers.Sources{BudgetPackets: 30, PrefixV4: 32, PrefixV6: 64}
	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := &harness{tb: t, l: l}
	h.apply(p)
	h.expire()
	srcs := make([]netip.Addr, 64)
	frames := make([][]byte, len(srcs))
	for i := range srcs {
		srcs[i] = netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})
		frames[i] = udpFrom(t, srcs[i])
	}
	const (
		rate   = 3000.0 // 64 × 30 × 1.56
		maxGap = 15 * time.Millisecond
	)
	ts, _ := riseRun(t, h, frames, window, rate, rate, 3, 3)
	// On at the same rate until 40 % into the window then open, at most
	// one window more.
	start := time.Now()
	sent := 0.0
	for time.Since(start) < window {
		w := h.window()
		if el := time.Duration(monotonicNow(t) - w.StartNs); el >= 2*window/5 && el < window/2 {
			break
		}
		for due := rate * float64(time.Since(start)) / float64(window); sent < due; sent++ {
			ts = append(ts, monotonicNow(t))
			h.run(frames[(len(ts)-1)%len(frames)])
		}
		time.Sleep(time.Millisecond - time.Since(start)%time.Millisecond)
	}
	before := monotonicNow(t)
	in, total, err := h.l.FleetEstimate()
	if err != nil {
		t.Fatal(err)
	}
	after := monotonicNow(t)
	m := model.NewModel(p, h.tab, nil)
	m.SetTick(h.l.TickNs())
	m.SetSketchSeeds(h.l.SketchSeeds())
	w := h.window()
	var stall uint64 // the longest gap between packets from two windows before this one's start
	for i, at := range ts {
		m.PacketFrom(at, srcs[i%len(srcs)])
		if i > 0 && at+2*uint64(window) >= w.StartNs {
			stall = max(stall, at-ts[i-1])
		}
	}
	hiIn, hiTotal := m.EstimateAt(before)
	loIn, loTotal := m.EstimateAt(after)
	tick := after >> tiers.SmoothTickShift
	st := tiers.SmoothState{Elapsed: tick - min(tick, w.StartNs>>tiers.SmoothTickShift), Ticks: h.tab.Settings.SmoothTicks, Gap: w.Gap, Prev: w.LastCount}
	even, _ := tiers.LiveEstimates(st, w.Count, w.LastCount, min(w.Count, 1920), tiers.LiveLatch{}, false, 0, tiers.Profiles{})
	t.Logf("40 %% in: R̂_in %d (model %d..%d, the even spread about %d), R̂_tot %d (model %d..%d); model latched %v, the longest gap between packets %v; window %+v",
		in, loIn, hiIn, even, total, loTotal, hiTotal, m.Latched(), time.Duration(stall).Round(10*time.Microsecond), w)
	if m.Latched() || time.Duration(stall) > maxGap {
		return false
	}
	if float64(in) < 0.97*float64(loIn) || float64(in) > 1.03*float64(hiIn) {
		t.Errorf("R̂_in %d, the model's %d..%d: want within 3 %%", in, loIn, hiIn)
	}
	if math.Abs(float64(in)-1920) > 192 {
		t.Errorf("R̂_in %d, want the in-budget count 1,920 within 10 %%", in)
	}
	return true
}
