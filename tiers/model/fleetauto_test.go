package model

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// A fleet of two on the model (docs/design.md §12, "With max: auto"):
// member 0 has max: auto with a learnt max of 300 and folds it into the
// others' sum at each report (FleetOthersWithAuto), member 1 has none.
// Offered 1000 and 3000 per window, member 0 passes its local P(1000),
// well under its fleet share 1000 × P(4000)/4000, and member 1 passes its
// fleet share 3000 × P(4000)/4000: the fold costs the others nothing, as
// member 0 reports its own R̂. From the third window on, within 5σ plus
// 3 % for the estimate's lag at the reports' pace; over seeds.
func TestFleetModelAuto(t *testing.T) {
	const (
		window  = time.Second
		report  = 100 * time.Millisecond
		windows = 8
	)
	p := fleetPolicy(t, 3000, 300)
	p.Auto = &tiers.AutoMax{Start: 300, Floor: 100, Ceiling: 2000}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	fleet := mustCompile(t, p)
	local := mustCompile(t, p.Local())
	rates := []float64{1000, 3000}
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 11))
		ms := []*Model{NewModel(p, fleet, rng.Uint32), NewModel(p, fleet, rng.Uint32)}
		var offered, passed [2][windows]int
		W := float64(window)
		next := []float64{rng.Float64() * W / rates[0], rng.Float64() * W / rates[1]}
		nextReport := uint64(report)
		for {
			i := 0
			if next[1] < next[0] {
				i = 1
			}
			now := uint64(next[i])
			for ; nextReport <= now; nextReport += uint64(report) {
				in0, e0 := ms[0].EstimateAt(nextReport)
				in1, e1 := ms[1].EstimateAt(nextReport)
				ms[0].SetFleetOthers(tiers.FleetOthersWithAuto(fleet, local, in0, e0, in1, e1))
				ms[1].SetFleetOthers(in0, e0)
			}
			k := int(next[i] / W)
			if k >= windows {
				break
			}
			offered[i][k]++
			if ms[i].Packet(now).Verdict == tiers.VerdictPass {
				passed[i][k]++
			}
			next[i] += W / rates[i]
		}
		for k := 2; k < windows; k++ {
			o0, o1 := offered[0][k], offered[1][k]
			rf := float64(o0 + o1)
			share := fleet.Expected(uint64(rf)).Passed / rf
			for i, want := range []float64{local.Expected(uint64(o0)).Passed, float64(o1) * share} {
				o := []int{o0, o1}[i]
				sigma := math.Sqrt(want * (1 - want/float64(o)))
				if math.Abs(float64(passed[i][k])-want) > 5*sigma+0.03*want {
					t.Errorf("seed %d window %d: member %d offered %d passed %d, want %.0f ± (5 × %.1f + 3%%); member 0's fleet share %.0f",
						seed, k, i, o, passed[i][k], want, sigma, float64(o0)*share)
				}
			}
		}
	}
}

// With max: auto and per-source budgets (docs/design.md §12): member 0,
// learnt max 300 and a budget of 5 % of it (15 per group), carries light
// groups (20 of 10 per window) and a noisy group of 800 per window;
// member 1 carries 2,000 in light groups. Folding its learnt max into both
// sums at each report (FleetOthersWithAuto), member 0 passes no more than
// it passes alone under its learnt max (Policy.Local, the same budgets,
// the same streams), where the fleet's share alone (fleet.max 3,000)
// would pass more; its light groups pass no less than alone. Over seeds,
// from the third window on, within 5σ plus 3 % for the reports' lag.
// Folding the in-budget sum alone (the total only keeping the others'
// over-budget part), member 0 passed 15,607 where alone it passes 6,264.
func TestFleetModelAutoBudgets(t *testing.T) {
	const (
		window  = time.Second
		report  = 100 * time.Millisecond
		windows = 8
		from    = 2
		seeds   = 4
	)
	p := fleetPolicy(t, 3000, 300)
	p.Auto = &tiers.AutoMax{Start: 300, Floor: 100, Ceiling: 2000}
	p.Sources = tiers.Sources{Budget: tiers.Pct(5), PrefixV4: 32, PrefixV6: 64}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	fleet := mustCompile(t, p)
	local := mustCompile(t, p.Local())
	if fleet.Sources.Budget != 15 || local.Sources.Budget != 15 {
		t.Fatalf("budgets %d, %d; want 5 %% of the learnt max 300 = 15", fleet.Sources.Budget, local.Sources.Budget)
	}
	light0 := make([]netip.Addr, 20)
	for i := range light0 {
		light0[i] = netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})
	}
	noisy := netip.MustParseAddr("192.0.2.1")
	light1 := make([]netip.Addr, 200)
	for i := range light1 {
		light1[i] = netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(i%250 + 1)})
	}
	type stream struct {
		member int
		srcs   []netip.Addr
		rate   float64
	}
	streams := []stream{{0, light0, 200}, {0, []netip.Addr{noisy}, 800}, {1, light1, 2000}}
	// run offers the streams; with fold, member 0 folds its learnt max
	// into the sums, else (alone) member 0 judges on its local policy
	// with no others. It returns member 0's light and noisy passes.
	run := func(seed uint64, alone bool) (lightPass, noisyPass, lightOff, noisyOff int) {
		rng := rand.New(rand.NewPCG(seed, 21))
		seeds := randomSeeds(rng)
		var ms []*Model
		if alone {
			ms = []*Model{NewModel(p.Local(), local, rng.Uint32), NewModel(p, fleet, rng.Uint32)}
		} else {
			ms = []*Model{NewModel(p, fleet, rng.Uint32), NewModel(p, fleet, rng.Uint32)}
		}
		ms[0].SetSketchSeeds(seeds)
		ms[1].SetSketchSeeds(randomSeeds(rng))
		W := float64(window)
		next := make([]float64, len(streams))
		turn := make([]int, len(streams))
		for i, s := range streams {
			next[i] = rng.Float64() * W / s.rate
		}
		nextReport := uint64(report)
		for {
			i := 0
			for j := range next {
				if next[j] < next[i] {
					i = j
				}
			}
			now := uint64(next[i])
			for ; nextReport <= now; nextReport += uint64(report) {
				in0, e0 := ms[0].EstimateAt(nextReport)
				in1, e1 := ms[1].EstimateAt(nextReport)
				if !alone {
					ms[0].SetFleetOthers(tiers.FleetOthersWithAuto(fleet, local, in0, e0, in1, e1))
				}
				ms[1].SetFleetOthers(in0, e0)
			}
			k := int(next[i] / W)
			if k >= windows {
				return
			}
			s := streams[i]
			d := ms[s.member].PacketFrom(now, s.srcs[turn[i]%len(s.srcs)])
			turn[i]++
			if k >= from && s.member == 0 {
				pass := 0
				if d.Verdict == tiers.VerdictPass {
					pass = 1
				}
				if i == 0 {
					lightPass, lightOff = lightPass+pass, lightOff+1
				} else {
					noisyPass, noisyOff = noisyPass+pass, noisyOff+1
				}
			}
			next[i] += W / s.rate
		}
	}
	var fl, nf, al, na, lo, no int
	for seed := range uint64(seeds) {
		a, b, c, d := run(seed, false)
		fl, nf, lo, no = fl+a, nf+b, lo+c, no+d
		a, b, _, _ = run(seed, true)
		al, na = al+a, na+b
	}
	got, want := float64(fl+nf), float64(al+na)
	off := float64(lo + no)
	share := off * fleet.Expected(3000).Passed / 3000 // R_fleet 3,000 per window
	t.Logf("member 0 passed %.0f of %.0f folded (light %d, noisy %d), %.0f alone under its learnt max (light %d, noisy %d); the fleet's share alone %.0f",
		got, off, fl, nf, want, al, na, share)
	sigma := math.Sqrt(want * (1 - want/off))
	if got > want+5*sigma+0.03*want {
		t.Errorf("member 0 passed %.0f with the fold, want at most %.0f (alone under its learnt max) + (5 × %.1f + 3%%)", got, want, sigma)
	}
	if ls := math.Sqrt(float64(al)); float64(fl) < float64(al)-5*ls-0.03*float64(al) {
		t.Errorf("member 0's light groups passed %d with the fold, want at least %d (alone) − (5 × %.1f + 3%%)", fl, al, ls)
	}
}
