package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// A fleet member reports with the estimator it judges with (issue 39 item
// 4; docs/design.md §12): from a steady 0.5 × max, a step to 10 × max at
// 0.6 of a window, on 64 groups each within its budget before the step
// (with budgets) or without budgets; every 10 ms of the flood's first
// window what the member reports (EstimateAt, tiers.LiveEstimates) is,
// without budgets, within 10 % of the R̂ its latest packet was judged on
// (Model.Estimate), and from 50 ms into the flood R̂_tot is within 10 % of
// the flood's rate, with budgets as without. Before, the report was F = n/f from the
// window's start while the program judged on the recent rate: 0.2 × to
// 0.6 × of it mid-window, and the others judged on that report passed the
// flood's member's share as if it had not risen.
func TestLiveEstimatesJudged(t *testing.T) {
	const window = time.Second
	for _, budgets := range []bool{false, true} {
		t.Run(fmt.Sprintf("budgets=%v", budgets), func(t *testing.T) {
			p := tiers.Default()
			p.Shape, p.Window, p.Max = tiers.ShapeSmooth, window, 1000
			if budgets {
				p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
			}
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			tab := mustCompile(t, p)
			rng := rand.New(rand.NewPCG(1, 2))
			m := NewModel(p, tab, rng.Uint32)
			srcs := make([]netip.Addr, 64)
			for i := range srcs {
				srcs[i] = netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})
			}
			W := float64(window)
			step := 3.6 * W
			checks, next := 0, step+0.01*W
			k := 0
			for at := 0.0; at < step+W; k++ {
				m.PacketFrom(uint64(at), srcs[k%len(srcs)])
				if at >= next {
					next += 0.01 * W
					in, total := m.EstimateAt(uint64(at))
					checks++
					if judged := m.Estimate(); !budgets && (float64(total) < 0.9*float64(judged) || float64(total) > 1.1*float64(judged)) {
						t.Errorf("%.0f ms into the flood: reported R̂ %d, judged on %d; want within 10 %%", (at-step)/1e6, total, judged)
					}
					if at >= step+0.05*W && (total < 9000 || total > 11000 || in > total) {
						t.Errorf("%.0f ms into the flood: reported R̂_in %d, R̂_tot %d; want R̂_tot within 10 %% of the flood's 10,000 per window, R̂_in at most it", (at-step)/1e6, in, total)
					}
				}
				rate := 500.0
				if at >= step {
					rate = 10000
				}
				at += W / rate
			}
			if checks < 90 {
				t.Fatalf("%d checks", checks)
			}
		})
	}
}
