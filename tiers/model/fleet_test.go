package model

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// fleetPolicy is the default policy's tiers, smooth, with a fleet of
// fleet.max fleetMax and a local max of localMax.
func fleetPolicy(t *testing.T, fleetMax, localMax uint64) tiers.Policy {
	t.Helper()
	p := tiers.Default()
	p.Shape, p.Max = tiers.ShapeSmooth, localMax
	p.Fleet = &tiers.Fleet{Name: "t", Store: "redis://h", Max: fleetMax, Report: 100 * time.Millisecond, TTL: 3 * time.Second}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

// fleetRun offers each member rates[i] packets per window, evenly spaced
// from a random phase, for windows windows through f, and returns each
// member's offered and passed packets per wall-clock window.
func fleetRun(f *FleetModel, window time.Duration, rates []float64, windows int, rng *rand.Rand) (offered, passed [][]int) {
	W := float64(window)
	next := make([]float64, len(rates))
	for i, r := range rates {
		next[i] = rng.Float64() * W / r
	}
	offered, passed = make([][]int, len(rates)), make([][]int, len(rates))
	for i := range rates {
		offered[i], passed[i] = make([]int, windows), make([]int, windows)
	}
	for {
		i := 0
		for j := range next {
			if next[j] < next[i] {
				i = j
			}
		}
		k := int(next[i] / W)
		if k >= windows {
			return offered, passed
		}
		d := f.Packet(i, uint64(next[i]))
		offered[i][k]++
		if d.Verdict == tiers.VerdictPass {
			passed[i][k]++
		}
		next[i] += W / rates[i]
	}
}

// docs/design.md §12's rule on the model: three members offered 3 ×
// fleet.max per window, split 60/30/10, pass P(R_fleet) per window
// together from the third window on, within 5σ, and each member the same
// fraction of its offered load, within 5σ; over seeds.
func TestFleetModelSharing(t *testing.T) {
	const (
		fleetMax = 1000
		window   = time.Second
		windows  = 8
		seeds    = 12
	)
	p := fleetPolicy(t, fleetMax, 40000)
	tab := mustCompile(t, p)
	R := 3.0 * fleetMax
	rates := []float64{0.6 * R, 0.3 * R, 0.1 * R}
	pr := tab.Expected(uint64(R)).Passed
	frac := pr / R
	var staticSum float64
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 34))
		f := NewFleetModel(p, tab, len(rates), 0, rng.Uint32)
		offered, passed := fleetRun(f, window, rates, windows, rng)
		var memOff, memPass [3]int
		for k := 2; k < windows; k++ {
			off, pass := 0, 0
			for i := range rates {
				off += offered[i][k]
				pass += passed[i][k]
				memOff[i] += offered[i][k]
				memPass[i] += passed[i][k]
			}
			sigma := math.Sqrt(float64(off) * frac * (1 - frac))
			want := frac * float64(off) // P(R)/R of what this window was offered
			if math.Abs(float64(pass)-want) > 5*sigma {
				t.Errorf("seed %d window %d: fleet passed %d of %d, want %.0f ± 5 × %.1f (P(R) %.0f)", seed, k, pass, off, want, sigma, pr)
			}
		}
		for i := range rates {
			got := float64(memPass[i]) / float64(memOff[i])
			sigma := math.Sqrt(frac * (1 - frac) / float64(memOff[i]))
			if math.Abs(got-frac) > 5*sigma {
				t.Errorf("seed %d member %d: passed %.4f of its offered, want %.4f ± 5 × %.4f", seed, i, got, frac, sigma)
			}
		}
		if seed == 0 {
			t.Logf("fleet: P(R) %.0f of R %.0f (%.3f); members passed %v of %v from window 3 on", pr, R, frac, memPass, memOff)
		}
		// Beside it, not asserted: each member alone with a static max
		// of fleet.max ÷ 3.
		q := p.FleetFallbackPolicy(3)
		qt := mustCompile(t, q)
		for _, r := range rates {
			staticSum += qt.Expected(uint64(r)).Passed
		}
	}
	t.Logf("static split fleet.max ÷ 3: %.0f per window in expectation, against the fleet's %.0f", staticSum/seeds, pr)
}

// With others 0 a member is the plain smooth model, decision for
// decision; with others X each packet is judged at q(own R̂ + X).
func TestFleetOthersJoinEstimate(t *testing.T) {
	p := fleetPolicy(t, 1000, 1000)
	tab := mustCompile(t, p)
	for _, x := range []uint64{0, 700, 5000} {
		a := NewModel(p, tab, rand.New(rand.NewPCG(1, 2)).Uint32)
		b := NewModel(p, tab, rand.New(rand.NewPCG(1, 2)).Uint32)
		a.SetFleetOthers(x, x)
		c := NewModel(p, tab, nil)
		c.SetFleetOthers(x, 2*x) // the others' total: no packet here is over budget
		for n := range uint64(5000) {
			now := n * 200_000 // 5000 per second
			da := a.Packet(now)
			db := b.Packet(now)
			if x == 0 && da != db {
				t.Fatalf("others 0, packet %d: %+v, plain %+v", n, da, db)
			}
			c.Packet(now)
			if c.Estimate() != b.Estimate() {
				t.Fatalf("others %d, packet %d: Estimate %d, want the own R̂ %d", x, n, c.Estimate(), b.Estimate())
			}
			if wantTier, _ := tab.Smooth(b.Estimate() + x); da.Tier != wantTier {
				t.Fatalf("others %d, packet %d: tier %d, want %d (of R̂ %d + %d)", x, n, da.Tier, wantTier, b.Estimate(), x)
			}
		}
	}
}

// EstimateAt reads the live R̂: the rate per window under a steady rate
// from the second window on, the ending window's share once it has
// expired, and 0 after a long idle.
func TestEstimateAt(t *testing.T) {
	p := fleetPolicy(t, 1000, 1000)
	tab := mustCompile(t, p)
	m := NewModel(p, tab, nil)
	const rate = 2000
	var now uint64
	for n := range uint64(3 * rate) {
		now = n * uint64(time.Second) / rate
		m.Packet(now)
	}
	if in, got := m.EstimateAt(now); math.Abs(float64(got)-rate) > 0.02*rate || in != got {
		t.Errorf("steady: EstimateAt %d, %d, want %d ± 2%% twice (no budgets: all in budget)", in, got, rate)
	}
	if in, got := m.EstimateAt(now + uint64(1100*time.Millisecond)); got > rate || in != got {
		t.Errorf("expired: EstimateAt %d, %d, want at most %d twice", in, got, rate)
	}
	if in, got := m.EstimateAt(now + uint64(3*time.Second)); got != 0 || in != 0 {
		t.Errorf("idle: EstimateAt %d, %d, want 0", in, got)
	}
}

// A member with max: auto passes no more than its own learnt max allows
// on its own R̂ (FleetOthersWithAuto), and no less than the fleet's share
// when that is the smaller.
func TestFleetOthersWithAuto(t *testing.T) {
	p := fleetPolicy(t, 3000, 500)
	fleet := mustCompile(t, p)
	local := mustCompile(t, p.Local())
	if local.Bounds[0] != 350 || fleet.Bounds[0] != 2100 {
		t.Fatalf("bounds: local %v fleet %v", local.Bounds, fleet.Bounds)
	}
	for _, c := range []struct{ own, others uint64 }{
		{1000, 500}, {1000, 8000}, {200, 100}, {3000, 0}, {600, 2400},
	} {
		o, tot := tiers.FleetOthersWithAuto(fleet, local, c.own, c.own, c.others, c.others)
		if tot != o {
			t.Errorf("own %d others %d, no budgets: folded %d, %d; want the two sums equal", c.own, c.others, o, tot)
		}
		_, got := fleet.Smooth(c.own + o)
		_, fl := fleet.Smooth(c.own + c.others)
		_, lo := local.Smooth(c.own)
		if got < max(fl, lo) {
			t.Errorf("own %d others %d: folded %d, threshold %#x, want at least max(fleet %#x, local %#x)", c.own, c.others, o, got, fl, lo)
		}
		if o > c.others {
			if _, prev := fleet.Smooth(c.own + o - 1); prev >= lo {
				t.Errorf("own %d others %d: %d is not the least sum", c.own, c.others, o)
			}
		} else if o != c.others || fl < lo {
			t.Errorf("own %d others %d: folded %d where the fleet's threshold %#x is already at least the local %#x", c.own, c.others, o, fl, lo)
		}
	}
	// With traffic over budget: in-budget packets at least the local
	// threshold at own R̂_in, over-budget ones at least the local share of
	// (R̂_in, R̂_tot), the others' over-budget part kept, and the total the
	// least that does it.
	for _, c := range []struct{ ownIn, ownTot, othersIn, othersTot uint64 }{
		{1000, 1500, 500, 900}, {200, 1200, 100, 100}, {300, 3000, 2000, 2500}, {100, 400, 8000, 9000},
	} {
		in, tot := tiers.FleetOthersWithAuto(fleet, local, c.ownIn, c.ownTot, c.othersIn, c.othersTot)
		if in < c.othersIn || tot < c.othersTot || in > tot || tot-in < c.othersTot-c.othersIn {
			t.Errorf("%+v: folded %d, %d; want at least the sums, in ≤ total, the others' %d over budget kept", c, in, tot, c.othersTot-c.othersIn)
			continue
		}
		_, thrIn := fleet.Smooth(c.ownIn + in)
		_, loIn := local.Smooth(c.ownIn)
		if thrIn < loIn {
			t.Errorf("%+v: in-budget threshold %#x at the fold, want at least the local %#x", c, thrIn, loIn)
		}
		ex := fleet.ShareThreshold(c.ownIn+in, c.ownTot+tot)
		loEx := local.ShareThreshold(c.ownIn, c.ownTot)
		if ex < loEx {
			t.Errorf("%+v: over-budget threshold %#x at the fold, want at least the local %#x", c, ex, loEx)
		}
		if base := c.othersTot + (in - c.othersIn); tot > base && fleet.ShareThreshold(c.ownIn+in, c.ownTot+tot-1) >= loEx {
			t.Errorf("%+v: total %d is not the least", c, tot)
		}
	}
	// On the model: a member offered 1000 per window whose learnt max is
	// 500 passes about P_local(1000), not the fleet's larger share.
	m := NewModel(p, fleet, rand.New(rand.NewPCG(3, 4)).Uint32)
	m.SetFleetOthers(tiers.FleetOthersWithAuto(fleet, local, 1000, 1000, 500, 500))
	passed := 0
	const windows, rate = 5, 1000
	for n := range uint64(windows * rate) {
		now := n * uint64(time.Second) / rate
		if m.Packet(now).Verdict == tiers.VerdictPass && n >= rate {
			passed++
		}
	}
	want := local.Expected(rate).Passed * (windows - 1)
	sigma := math.Sqrt(want)
	if math.Abs(float64(passed)-want) > 5*sigma+0.02*want {
		t.Errorf("auto member passed %d in %d windows, want %.0f (local P(R) each), the fleet's share is %.0f", passed, windows-1, want, fleet.Expected(1500).Passed*1000/1500*(windows-1))
	}
}
