package bpf_test

import (
	"math"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// The fleet's first second in the program (docs/design.md §12; fleet.h
// tl_fleet_others_now, tl_fleet_latch_min): from idle, 2 × fleet.max of
// own traffic paced in real time (1 ms steps) for a window on one CPU,
// with the others' sums and what they answer set (SetFleetOwn: own R̂ at
// the report, the member count), is dropped at the model's q(own R̂ +
// tiers.FleetOthersNow(...)) within 5σ, packet by packet's expectation, on
// the program's clock reads: the equal-share prior of an idle member, the
// sums scaled by the rise since the report, capped at 16, and unscaled
// with no rise or no member count; and in a fleet of 8 the model latches
// before the 16th packet (tiers.FleetLatchMin: 2), where alone it waits
// for the 16th. Since issue 39 the onset is the recent rate's (§9): an
// hour's window judged at full speed drops every packet whatever the
// sums, so the rate here is paced, near the table.
func TestFleetRiseProgram(t *testing.T) {
	pinCPU(t, 0) // the latch is per CPU, the model's is one CPU's
	const (
		fleetMax = 1000
		window   = 500 * time.Millisecond
	)
	p := fleetPolicyBPF(t, fleetMax, window)
	frame := testenv.UDP4(t, 514)
	for _, c := range []struct {
		name                 string
		others, own, members uint64
	}{
		{"plain, no member count", 500, 100, 0},
		{"idle: the prior", 0, 0, 3},
		{"idle, others busy: the prior or the sum", 2000, 5, 3},
		{"risen: scaled", 500, 1000, 3},
		{"risen past the cap", 100, 20, 3},
		{"no rise", 500, 20000, 3},
		{"fleet of 8: latch on the fleet's count", 0, 0, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, p)
			if err := h.l.SetFleetOwn(c.own, c.own, c.members); err != nil {
				t.Fatal(err)
			}
			if err := h.l.SetFleetOthers(c.others, c.others); err != nil {
				t.Fatal(err)
			}
			h.expire()
			m := model.NewModel(p, h.tab, nil)
			m.SetTick(h.l.TickNs())
			m.SetFleetOthers(c.others, c.others)
			m.SetFleetOwn(c.own, c.own, c.members)
			var want, variance, unscaled float64
			dropped, first := 0, -1
			pc := testenv.NewPacer(window, 1)
			var sent, due float64
			// The first 0.6 of the window: past it the recent rate (2 ×
			// fleet.max) nears the window's count S, and a release at
			// E ≤ S turns on the pacing's jitter (§9), in the program
			// and the model apart.
			for el := pc.Now(); el < pc.Span()*6/10; el = pc.Now() {
				due = 2 * fleetMax * float64(el) / float64(window)
				for ; sent < due; sent++ {
					now := monotonicNow(t)
					if h.run(frame) != xdpPass {
						dropped++
					}
					m.Packet(now)
					r := m.Estimate()
					latched := m.Latched()
					if latched && first < 0 {
						first = int(sent)
					}
					_, thr := h.tab.Smooth(r + tiers.FleetOthersNow(c.others, r, c.own, tiers.FleetRiseInv(c.own), c.members, latched))
					q := tiers.DropRatio(thr)
					want += q
					variance += q * (1 - q)
					_, thr = h.tab.Smooth(r + c.others)
					unscaled += tiers.DropRatio(thr)
				}
				pc.Sleep()
			}
			sigma := math.Sqrt(variance)
			t.Logf("dropped %d of %.0f, model %.1f ± %.1f (with the sums unscaled %.1f); the model latched at packet %d", dropped, sent, want, sigma, unscaled, first)
			// Real time is judged on what was offered: a loop descheduled
			// past the pacer's margin (CI's busy machine) offered another
			// schedule than the one judged, and its window is left out.
			if !pc.Judged(t, 0) {
				return
			}
			if math.Abs(float64(dropped)-want) > 5*sigma+1 {
				t.Errorf("dropped %d, want %.1f ± 5 × %.1f", dropped, want, sigma)
			}
			if c.members == 8 && (first < 0 || first >= tiers.SmoothOnsetMin-1) {
				t.Errorf("the model latched at packet %d in a fleet of 8; want before the 16th (the fleet's count)", first)
			}
		})
	}
}

// fleetPaced paces perWin packets per window through run for windows
// windows in real time (1 ms steps of a testenv.Pacer; bounded by the
// schedule's span), each run's clock (monotonicNow, read just before it)
// handed to run with its index: the fleet's program-vs-model tests, whose
// sums must show beside a member's own R̂ (since issue 39 an hour's
// window judged at full speed is a flood's rate, and drops every packet
// whatever the sums).
func fleetPaced(t *testing.T, window time.Duration, windows int, perWin float64, run func(i int, now uint64)) int {
	t.Helper()
	pc := testenv.NewPacer(window, windows)
	sent := 0
	for el := pc.Now(); el < pc.Span(); el = pc.Now() {
		for due := perWin * float64(el) / float64(window); float64(sent) < due; sent++ {
			run(sent, monotonicNow(t))
		}
		pc.Sleep()
	}
	return sent
}
