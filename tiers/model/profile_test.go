package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// manyOverBudget runs g groups, each sending mult × its budget per window
// in turn (evenly spaced, from one tick phase), through a model of p for
// windows windows, and returns each window's passes over P(R) from the
// third window on but for the last.
func manyOverBudget(p tiers.Policy, tab tiers.Table, seed uint64, g int, mult float64, windows int) []float64 {
	r := rand.New(rand.NewPCG(seed, 0xf0))
	m := NewModel(p, tab, r.Uint32)
	m.SetTick(1 << tiers.SmoothTickShift)
	m.SetSketchSeeds(randomSeeds(r))
	rate := float64(g) * 30 * mult
	now := uint64(1e12) + r.Uint64N(1<<tiers.SmoothTickShift)
	var per []float64
	for i := range int(rate * float64(windows)) {
		src := netip.AddrFrom4([4]byte{10, 0, byte(i % g >> 8), byte(i % g)})
		d := m.PacketFrom(now, src)
		now += uint64(float64(p.Window) / rate)
		if d.WindowOpened {
			per = append(per, 0)
		}
		if d.Verdict == tiers.VerdictPass {
			per[len(per)-1]++
		}
	}
	pr := tab.Expected(uint64(rate)).Passed
	var out []float64
	for _, v := range per[2 : len(per)-1] {
		out = append(out, v/pr)
	}
	return out
}

// docs/design.md §6, "the window passes P(R_in + R_ex), as without budgets",
// where every group is over its budget: g groups (8, 64, 200) each at
// 1.2, 2 and 5 × its budget of 30, steady, 40 seeds and tick phases each.
// Each group sends its budget's packets first and none after, so the
// window's in-budget packets are front-loaded. The sliding count that
// spread the previous window's in-budget count evenly over it read them
// up to 1.4 × their count, and the windows passed 0.94 to 0.70 × P(R)
// (less the more groups and the further over budget); it now takes the
// previous window's share from its profile (SmoothProfile), and the
// windows pass what they pass without budgets: the means within 3 % of
// each other, and with budgets no more than without beyond 4 standard
// errors of the difference.
func TestSmoothManyOverBudget(t *testing.T) {
	p := tiers.Default()
	p.Window, p.Max = 500*time.Millisecond, 300
	ref := mustCompile(t, p)
	p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
	tab := mustCompile(t, p)
	noBudgets := p
	noBudgets.Sources = tiers.Sources{}
	stats := func(xs []float64) (mean, se float64) {
		var s, sq float64
		for _, x := range xs {
			s += x
			sq += x * x
		}
		n := float64(len(xs))
		mean = s / n
		return mean, math.Sqrt(max(0, sq/n-mean*mean) / n)
	}
	for _, g := range []int{8, 64, 200} {
		for _, mult := range []float64{1.2, 2, 5} {
			t.Run(fmt.Sprintf("%dx%.1f", g, mult), func(t *testing.T) {
				var with, without []float64
				for seed := range uint64(40) {
					with = append(with, manyOverBudget(p, tab, seed, g, mult, 6)...)
					without = append(without, manyOverBudget(noBudgets, ref, seed, g, mult, 6)...)
				}
				mw, sw := stats(with)
				mo, so := stats(without)
				se := math.Hypot(sw, so)
				t.Logf("%d groups at %.1f × budget: %.4f × P(R) with budgets, %.4f without (se of the difference %.4f)", g, mult, mw, mo, se)
				if math.Abs(mw-mo) > 0.03 || mw > mo+4*se {
					t.Errorf("%d groups at %.1f × budget: %.4f × P(R) with budgets, %.4f without; want within 3 %% and no more than without", g, mult, mw, mo)
				}
			})
		}
	}
}
