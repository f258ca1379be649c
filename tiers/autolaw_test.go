package tiers

import (
	"strings"
	"testing"
)

// lawRig feeds the law one window at a time, as the agent's controller
// does.
type lawRig struct {
	law  AutoLaw
	full float64
	cuts int
}

func newLawRig(start, floor, ceiling uint64) *lawRig {
	return &lawRig{law: NewAutoLaw(AutoMax{Start: start, Floor: floor, Ceiling: ceiling}, start)}
}

func (r *lawRig) window(delivered, shed, drops uint64) uint64 {
	before := r.law.Max()
	m, cause := r.law.Judge(AutoSample{Delivered: delivered, Shed: shed, Drops: drops, Full: r.full})
	if (cause != "") != (m != before) {
		panic("a change without a cause, or a cause without a change")
	}
	if m < before {
		r.cuts++
	}
	return m
}

func TestAutoLawCutsInProportionBoundedByBeta(t *testing.T) {
	r := newLawRig(40000, 1000, 200000)
	for i, c := range []struct {
		name                   string
		delivered, shed, drops uint64
		want                   uint64
	}{
		{"5% of what was delivered dropped: max × 0.95", 20000, 30000, 1000, 38000},
		{"the window after a cut is not cut", 20000, 30000, 18000, 38000},
		{"drops go on: the cut is bounded by Beta", 20000, 30000, 18000, uint64(38000 * AutoBeta)},
		{"a clean window", 20000, 30000, 0, 26600},
		{"first drops after a clean window: bounded by BetaFirst", 20000, 30000, 18000, uint64(26600 * AutoBetaFirst)},
		{"clean", 1000000, 1, 0, 23940},
		{"one drop in a million still lowers max by one packet", 1000000, 1, 1, 23939},
		{"clean", 1000000, 1, 0, 23939},
		{"drops with nothing delivered: BetaFirst", 0, 100, 5, 21545},
	} {
		if got := r.window(c.delivered, c.shed, c.drops); got != c.want {
			t.Errorf("window %d (%s): max %d, want %d", i+1, c.name, got, c.want)
		}
	}
	if r.cuts != 5 {
		t.Errorf("%d cuts, want 5", r.cuts)
	}
}

func TestAutoLawBounds(t *testing.T) {
	r := newLawRig(1000, 900, 1100)
	for range 5 {
		r.window(100, 1000, 500)
	}
	if got := r.law.Max(); got != 900 || r.cuts != 1 {
		t.Fatalf("max after many cuts = %d in %d cuts, want floor 900 in one", got, r.cuts)
	}
	for range 40 {
		if got := r.window(1000, 1000, 0); got < 900 || got > 1100 {
			t.Fatalf("max %d outside [900, 1100]", got)
		}
	}
	if got := r.law.Max(); got != 1100 {
		t.Fatalf("max after many clean windows = %d, want ceiling 1100", got)
	}
}

func TestAutoLawNoChangeWhileNotShedding(t *testing.T) {
	r := newLawRig(40000, 1000, 200000)
	for range 50 {
		r.window(30000, 0, 0)
	}
	if got := r.law.Max(); got != 40000 {
		t.Fatalf("max %d: clean windows without shedding must change nothing", got)
	}
	// Near the last max with drops (here 40000, cut to 38000), shedding
	// windows interrupted by one without shedding start the count again.
	r.window(20000, 30000, 1000)
	for range 10 {
		r.window(30000, 100, 0)
		r.window(30000, 0, 0)
	}
	if got := r.law.Max(); got != 38000 {
		t.Fatalf("max %d: %d clean windows while shedding are needed in a row", got, AutoK)
	}
	alpha := AutoAlpha(AutoMax{Start: 40000})
	// A collector whose buffer is more than half full is behind: clean
	// windows do not count. (The buffer fills in a window without
	// shedding, where max does not matter, so that it is not a growing
	// backlog while the tiers shed: TestAutoLawCutsGrowingBacklog.)
	r.full = 0.6
	r.window(30000, 0, 0)
	for range 2 * AutoK {
		r.window(30000, 100, 0)
	}
	if got := r.law.Max(); got != 38000 {
		t.Fatalf("max %d raised while the collector's buffer was 60%% full", got)
	}
	r.full = 0.4
	for range AutoK {
		r.window(30000, 100, 0)
	}
	if got := r.law.Max(); got != 38000+alpha {
		t.Fatalf("max %d after %d clean shedding windows, want 38000 + alpha", got, AutoK)
	}
	// More than 10% over it, one clean window is enough and the step
	// doubles each time, up to AutoAlphaCap × alpha.
	for r.law.Max() <= 44000 {
		r.window(30000, 100, 0)
	}
	m := r.law.Max()
	for _, step := range []uint64{alpha, 2 * alpha, 4 * alpha, 8 * alpha, 16 * alpha, 16 * alpha} {
		if got := r.window(30000, 100, 0); got != m+step {
			t.Fatalf("probing: max %d, want %d + %d", got, m, step)
		}
		m += step
	}
}

// TestAutoLawCutsGrowingBacklog: a receive buffer over half full that grew
// by AutoRise or more since the window before, while the tiers shed, is
// cut by BetaFirst before it overflows; a full buffer that holds or drains
// is not, nor one that grows below half, nor one that grows while nothing
// is shed, nor one in the window right after a cut.
func TestAutoLawCutsGrowingBacklog(t *testing.T) {
	r := newLawRig(40000, 1000, 200000)
	for i, c := range []struct {
		name string
		full float64
		shed uint64
		want uint64
	}{
		{"first window: no fill before it to compare", 0.8, 100, 40000},
		{"over half and 5% fuller: cut", 0.85, 100, 36000},
		{"the window after a cut is not cut", 0.95, 100, 36000},
		{"full but draining", 0.9, 100, 36000},
		{"full and holding", 0.9, 100, 36000},
		{"under AutoRise fuller", 0.9 + AutoRise/2, 100, 36000},
		{"grows, but nothing shed", 0.99, 0, 36000},
		{"drains under half", 0.2, 100, 36000},
		{"grows from 20% to 45%: under half, so a second clean window: max + alpha", 0.45, 100, 36400},
		{"grows from 45% to 55%: cut", 0.55, 100, 32760},
	} {
		r.full = c.full
		if got := r.window(30000, c.shed, 0); got != c.want {
			t.Errorf("window %d (%s): max %d, want %d", i+1, c.name, got, c.want)
		}
	}
	// After the cut the step up starts again at alpha near the cut max.
	r.full = 0
	for range AutoK {
		r.window(30000, 100, 0)
	}
	if got, want := r.law.Max(), 32760+AutoAlpha(AutoMax{Start: 40000}); got != want {
		t.Errorf("max %d after %d clean windows, want %d", got, AutoK, want)
	}
}

// TestAutoLawCutsStandingBacklog: mild drops while the receive buffer stays
// over AutoFull come from a standing backlog, so the cut is BetaFirst, not
// 1 − D/P: the latter gives the collector exactly what it reads, and the
// backlog and its drops stand (TestAutoMaxSlowCollector under the smooth
// shape, where max crept down by 1% every other window).
func TestAutoLawCutsStandingBacklog(t *testing.T) {
	r := newLawRig(40000, 1000, 200000)
	r.full = 0.97
	if got, want := r.window(20000, 30000, 200), uint64(40000*AutoBetaFirst); got != want {
		t.Errorf("1%% drops from a buffer 97%% full: max %d, want %d", got, want)
	}
	r.window(20000, 30000, 200) // the window after a cut
	r.full = AutoFull
	if got, want := r.window(20000, 30000, 200), uint64(36000*0.99); got != want {
		t.Errorf("1%% drops from a buffer at AutoFull: max %d, want %d (1 − D/P)", got, want)
	}
}

// TestAutoLawHold: windows with no collector socket to judge them by
// forget the clean windows and the fill, so the next fill is never growth.
func TestAutoLawHold(t *testing.T) {
	r := newLawRig(40000, 1000, 200000)
	r.window(20000, 30000, 1000) // cut to 38000
	r.window(30000, 100, 0)      // one clean window
	r.law.Hold()
	r.full = 0.9
	if got := r.window(30000, 100, 0); got != 38000 {
		t.Fatalf("max %d: a fill after Hold is no growth, and a full buffer no clean window", got)
	}
	r.full = 0
	if got := r.window(30000, 100, 0); got != 38000 {
		t.Fatalf("max %d: Hold forgot the clean window before it, so one more is not %d", got, AutoK)
	}
	if m, cause := r.law.Judge(AutoSample{Delivered: 100, Shed: 1, Drops: 50}); m >= 38000 || !strings.Contains(cause, "50 collector socket drops of 100 packets") {
		t.Errorf("cut to %d, cause %q", m, cause)
	}
}
