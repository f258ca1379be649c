package bpf_test

import (
	"math"
	"testing"
	"time"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// The fleet's first second in the program (docs/design.md §12;
// smooth.h sm_fleet_others, sm_fleet_onset): windows of 300 packets, each
// judged in its first ticks of an hour's window (an onset, R̂ the onset's
// 32 n, deterministic), with the others' sums and what they answer set
// (SetFleetOwn: own R̂ at the report, the member count) are dropped at the
// model's q(own R̂ + tiers.FleetOthersNow(...)) within 5σ, packet by
// packet's expectation: the equal-share prior of an idle member, the sums
// scaled by the rise since the report, capped at 16, and unscaled with no
// rise or no member count; and, in a fleet of 8, the onset latches at the
// 2nd packet (16 fleet packets), where alone it waits for the 16th.
func TestFleetRiseProgram(t *testing.T) {
	const (
		fleetMax = 1000
		perWin   = 300
		windows  = 20
	)
	p := fleetPolicyBPF(t, fleetMax, time.Hour)
	frame := UDP4(t, 514)
	for _, c := range []struct {
		name                 string
		others, own, members uint64
	}{
		{"plain, no member count", 500, 100, 0},
		{"idle: the prior", 0, 0, 3},
		{"idle, others busy: the prior or the sum", 2000, 5, 3},
		{"risen: scaled", 500, 1000, 3},
		{"risen past the cap", 500, 20, 3},
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
			m := model.NewModel(p, h.tab, nil)
			m.SetTick(h.l.TickNs())
			m.SetFleetOthers(c.others, c.others)
			m.SetFleetOwn(c.own, c.own, c.members)
			var want, variance, wantFirst float64
			dropped, droppedFirst := 0, 0
			for k := range uint64(windows) {
				h.expire()
				now := k * uint64(time.Hour+time.Millisecond)
				for j := range perWin {
					drop := h.run(frame) != xdpPass
					m.Packet(now)
					r := m.Estimate()
					onset := m.Onset()
					_, thr := h.tab.Smooth(r + tiers.FleetOthersNow(c.others, r, c.own, tiers.FleetRiseInv(c.own), c.members, onset))
					q := tiers.DropRatio(thr)
					if j < 16 {
						wantFirst += q
						if drop {
							droppedFirst++
						}
					}
					want += q
					variance += q * (1 - q)
					if drop {
						dropped++
					}
				}
			}
			sigma := math.Sqrt(variance)
			t.Logf("dropped %d of %d, model %.1f ± %.1f; of the first 16 of each window %d, model %.1f", dropped, windows*perWin, want, sigma, droppedFirst, wantFirst)
			if math.Abs(float64(dropped)-want) > 5*sigma+1 {
				t.Errorf("dropped %d, want %.1f ± 5 × %.1f", dropped, want, sigma)
			}
			if c.members == 8 && wantFirst < 1 {
				t.Errorf("the model drops %.1f of the first 16 packets of a window in a fleet of 8; want the onset latched on the fleet's count", wantFirst)
			}
		})
	}
}
