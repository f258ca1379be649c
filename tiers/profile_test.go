package tiers

import (
	"math"
	"testing"
)

// SmoothProfile.Base is the even spread on an even profile, and reads a
// front-loaded one as it is.
func TestSmoothProfileBase(t *testing.T) {
	const j = 100
	var even, front SmoothProfile
	for e := range uint64(j) {
		even.Record(e, j, 1+e*10) // 10 a tick from the window's start
		front.Record(e, j, min(1+e*20, 1000))
	}
	// Steps of ⌈100/16⌉ = 7 ticks: 15 of them start within the window.
	if steps := int((j + SmoothProfStep(j) - 1) / SmoothProfStep(j)); even.Known != steps || front.Known != steps {
		t.Fatalf("known %d, %d, want %d", even.Known, front.Known, steps)
	}
	for _, c := range []struct{ e, gap uint64 }{{0, 0}, {10, 0}, {37, 0}, {50, 0}, {90, 0}, {99, 0}, {20, 30}, {60, 50}} {
		uniform := SmoothState{Elapsed: c.e, Ticks: j, Gap: c.gap, Prev: 1000}.Coef().Base
		if got := even.Base(1000, c.e, j, c.gap); math.Abs(float64(got)-float64(uniform)) > 12 {
			t.Errorf("even, e %d gap %d: base %d, the even spread %d", c.e, c.gap, got, uniform)
		}
		// Front-loaded: all 1,000 by tick 50; the span starts e + ½ + gap
		// ticks into the previous window, after 20 (e + ½ + gap) of them.
		y := float64(c.e) + 0.5 + float64(c.gap)
		want := max(0, 1000-min(1000, 1+20*y))
		if got := front.Base(1000, c.e, j, c.gap); math.Abs(float64(got)-want) > 25 {
			t.Errorf("front-loaded, e %d gap %d: base %d, want %.0f", c.e, c.gap, got, want)
		}
	}
	if got := (SmoothProfile{}).Base(1000, 37, j, 0); got != (SmoothState{Elapsed: 37, Ticks: j, Prev: 1000}).Coef().Base {
		t.Errorf("no profile: base %d, want the even spread", got)
	}
	// A window that went quiet after tick 30: its samples stop there, and
	// every later one is its final count.
	var quiet SmoothProfile
	for e := range uint64(31) {
		quiet.Record(e, j, 1+e*10)
	}
	if got := quiet.Base(301, 60, j, 0); got != 0 {
		t.Errorf("quiet after tick 30, span from tick 60.5: base %d, want 0", got)
	}
}
