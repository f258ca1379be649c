package tiers

import (
	"math"
	"testing"
)

// smoothPolicy is the seed's tiers at max 1000 per 1 s window.
func smoothPolicy(shape Shape) Policy {
	p := Default()
	p.Shape = shape
	p.Max = 1000
	return p
}

// The table: q is 0 below T_1, P(R) per window in expectation at every R
// (the table's entries and the closed form beyond), and the closed form
// meets the last entry.
func TestSmoothTable(t *testing.T) {
	for _, p := range []Policy{smoothPolicy(ShapeSmooth), func() Policy {
		p := smoothPolicy(ShapeSmooth)
		p.Tiers = []Tier{{Pct(50), Pct(10)}, {Pct(90), Pct(60)}, {Pct(120), Pct(90)}}
		return p
	}(), func() Policy { p := smoothPolicy(ShapeSmooth); p.Max = 5_000_000; return p }()} {
		tab := mustCompile(t, p)
		for _, r := range []uint64{1, 100, 699, 700, 701, 850, 999, 1000, 1001, 1199, 1200, 1201, 2000, 5000, 10000, 123456} {
			r := r * p.Max / 1000
			tier, thr := tab.Smooth(r)
			e := tab.Expected(r)
			got := float64(r) * (1 - DropRatio(thr))
			if math.Abs(got-e.Passed) > 1e-3*float64(r)+1 {
				t.Errorf("max %d R %d: R(1-q) = %.2f, P(R) = %.2f", p.Max, r, got, e.Passed)
			}
			if r < p.Thresholds()[0] && thr != 0 {
				t.Errorf("max %d R %d below T_1: thr %d", p.Max, r, thr)
			}
			if want := p.TierOf(r); tab.Shift == 0 && tier != want {
				t.Errorf("max %d R %d: tier %d, want %d", p.Max, r, tier, want)
			}
		}
	}
}

// The estimator's parts: a steady rate reads as itself from the second
// window on, a jump is latched as an onset within 1/32 of a window, and
// the previous window's share ends with the window after it.
func TestSmoothEstimator(t *testing.T) {
	const J = 250
	// Steady 1000 per window, halfway: n = 500, prev = 1000.
	c := SmoothState{Elapsed: 125, Ticks: J, Prev: 1000}.Coef()
	if r, on := c.Estimate(500, false), c.Onset(500); on || r < 995 || r > 1005 {
		t.Errorf("steady: R̂ %d onset %v, want ~1000, no onset", r, on)
	}
	// From idle: 300 packets in the first 8 ticks of 10000/s.
	c = SmoothState{Elapsed: 7, Ticks: J}.Coef()
	if r, on := c.Estimate(300, true), c.Onset(300); !on || r < 9000 || r > 11000 {
		t.Errorf("onset: R̂ %d onset %v, want ~10000, onset", r, on)
	}
	// Fewer than SmoothOnsetMin packets never latch.
	if c.Onset(SmoothOnsetMin - 1) {
		t.Error("onset latched below SmoothOnsetMin")
	}
	// A gap of a whole window: the previous window weighs nothing.
	c = SmoothState{Elapsed: 0, Ticks: J, Gap: J, Prev: 1e6}.Coef()
	if c.Base != 0 {
		t.Errorf("after a gap of a window: base %d, want 0", c.Base)
	}
	// The end of a window: the previous window's share is gone.
	c = SmoothState{Elapsed: J, Ticks: J, Prev: 1e6}.Coef()
	if c.Base != 0 {
		t.Errorf("at the window's end: base %d, want 0", c.Base)
	}
}

// Property 5 (docs/design.md §9), huge floods: past the table q(R̂) is on the
// 2^32 scale, so from 10³ to 10⁶ × max, for max 100 and 40,000 and the
// last tier dropping all or nearly all, R̂ (1 − q(R̂)) is P(R̂) within
// 10⁻³, and never 0 while P(R̂) > 0. On 16 bits it lost 13 % at 10⁴ × max
// and passed nothing from 65,536 × P(R) on.
func TestSmoothHugeFlood(t *testing.T) {
	for _, max := range []uint64{100, 40_000} {
		for _, last := range []Percent{Pct(100), PercentFromMicro(99_990_000)} {
			p := smoothPolicy(ShapeSmooth)
			p.Max = max
			p.Tiers[len(p.Tiers)-1].Drop = last
			tab := mustCompile(t, p)
			for _, k := range []uint64{1e3, 3e3, 1e4, 65_536, 1e5, 3e5, 1e6} {
				r := k * max
				_, thr := tab.Smooth(r)
				got := float64(r) * (1 - DropRatio(thr))
				want := tab.Expected(r).Passed
				if got <= 0 || math.Abs(got-want) > 1e-3*want {
					t.Errorf("max %d last drop %v R %d × max: R(1-q) = %.2f, P(R) = %.2f", max, last, k, got, want)
				}
			}
		}
	}
}

// Issue 32 row 11: the largest valid config, max 2^40 with a tier at
// 100000 % (T = 2^40 × 1000, past 2^48 packets), keeps P(R̂) and the
// over-budget share right past the table: P at 16 fractional bits
// overflowed 64 bits there, and q read 0.94 where 0.25 is right.
func TestSmoothTableHuge(t *testing.T) {
	p := smoothPolicy(ShapeSmooth)
	p.Max = MaxPackets
	p.Tiers = []Tier{{Pct(50), Pct(10)}, {Pct(MaxAtPercent), Pct(25)}}
	tab := mustCompile(t, p)
	last := tab.Smoothed.LastN
	for _, r := range []uint64{last / 3, last - 1, last, last + 1, 2 * last, 1 << 52 / 3 * 2} {
		_, thr := tab.Smooth(r)
		got := float64(r) * (1 - DropRatio(thr))
		want := tab.Expected(r).Passed
		if math.Abs(got-want) > 1e-3*want {
			t.Errorf("R %d (%.3g × LastN): R(1-q) = %.4g (q %.4f), P(R) = %.4g", r, float64(r)/float64(last), got, DropRatio(thr), want)
		}
	}
	// Over-budget packets beyond in-budget ones past the table pass at
	// the last tier's rate.
	rin := last + last/4
	thr := tab.ShareThreshold(rin, 2*rin)
	if q := DropRatio(thr); math.Abs(q-0.25) > 1e-3 {
		t.Errorf("share past the table: q %.4f, want 0.25", q)
	}
}

// Issue 32 row 5: the band [T_last, LastN), where the ordinal shape's last
// tier has begun but the smooth table still runs, takes the smooth table's
// q, not the last tier's drop: R̂ (1 − q) is P(R̂), at a step of 1 (max
// 40,000) and of 2^7 (max 10^8).
func TestSmoothBand(t *testing.T) {
	for _, m := range []uint64{40_000, 1e8} {
		p := smoothPolicy(ShapeSmooth)
		p.Max = m
		tab := mustCompile(t, p)
		first := tab.TierStart(len(tab.Bounds))
		if first >= tab.Smoothed.LastN {
			t.Fatalf("max %d: no band: T_last %d, LastN %d", m, first, tab.Smoothed.LastN)
		}
		for r := first - 1; r <= tab.Smoothed.LastN; r += max(1, (tab.Smoothed.LastN-first)/7) {
			_, thr := tab.Smooth(r)
			got := float64(r) * (1 - DropRatio(thr))
			want := tab.Expected(r).Passed
			if got <= 0 || math.Abs(got-want) > 1e-3*want {
				t.Errorf("max %d R %d in [%d, %d): R(1-q) = %.1f, P(R) = %.1f", m, r, first, tab.Smoothed.LastN, got, want)
			}
		}
	}
}
