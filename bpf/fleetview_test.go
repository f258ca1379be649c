package bpf_test

import (
	"math"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// fleetScale is fleet.h's fleet_scale: r × k on 2^16, within
// tiers.FleetRhatMax.
func fleetScale(r, k uint64) uint64 {
	r = min(r, tiers.FleetRhatMax)
	return min((r>>16)*k+((r&0xffff)*k)>>16, tiers.FleetRhatMax)
}

// viewWindows runs windows of perWin packets on an own count injected at
// base (R̂ deterministic: the i-th packet of a window is judged on own R̂
// base + i), each window on fresh memos and perWin below
// tiers.SmoothOnsetMin, so that no window latches on its burst's rate
// (docs/design.md §9), and returns the drops and the expectation and
// variance when a packet of own R̂ r is judged at the fleet's table on
// judge(r).
func viewWindows(t *testing.T, h *harness, windows, perWin int, base uint64, judge func(r uint64) uint64) (dropped int, want, variance float64) {
	t.Helper()
	frame := UDP4(t, 514)
	for range windows {
		h.injectEstimate(base)
		for i := range perWin {
			if h.run(frame) != xdpPass {
				dropped++
			}
			_, thr := h.tab.Smooth(judge(base + uint64(i) + 1))
			q := tiers.DropRatio(thr)
			want += q
			variance += q * (1 - q)
		}
	}
	return dropped, want, variance
}

// The fleet's view expires (docs/design.md §12, "A view that expires";
// fleet.h): with a view that holds, a packet is judged at own R̂ + the
// others' sum; past its expiry, with no agent writing anything, at the
// fallback's multiplier on own R̂ alone (the others' sum counts for
// nothing); a program that was never given a view (a new agent's, before
// its first report) judges on the fallback from its first packet; and a
// view that expires while packets flow is left within a tick. Each against
// the model within 5σ.
func TestFleetViewExpiresProgram(t *testing.T) {
	const (
		fleetMax = 1000
		fbMax    = 250 // share of 4
		others   = 2000
		perWin   = tiers.SmoothOnsetMin - 1
		windows  = 200
		own      = 300
	)
	p := fleetPolicyBPF(t, fleetMax, time.Hour)
	k := tiers.FleetFallbackMult(fleetMax, fbMax)
	check := func(name string, h *harness, judge func(r uint64) uint64) {
		t.Helper()
		dropped, want, variance := viewWindows(t, h, windows, perWin, own, judge)
		sigma := math.Sqrt(variance)
		t.Logf("%s: dropped %d of %d, model %.1f ± %.1f", name, dropped, windows*perWin, want, sigma)
		if math.Abs(float64(dropped)-want) > 5*sigma+1 {
			t.Errorf("%s: dropped %d, want %.1f ± 5 × %.1f", name, dropped, want, sigma)
		}
	}
	withOthers := func(r uint64) uint64 { return r + others }
	alone := func(r uint64) uint64 { return fleetScale(r, k) }

	// At load the view never expires (no fleet); the agent applying a
	// fleet policy writes its fallback and an expired view (0) before its
	// first report: the fallback.
	h := newHarness(t, p)
	if exp, mult, stale, err := h.l.FleetView(); err != nil || exp != bpf.ViewForever || mult != 1<<16 || stale {
		t.Fatalf("at load: FleetView %d, %d, %v, %v; want never, 1.0, not stale", exp, mult, stale, err)
	}
	if err := h.l.SetFleetFallback(k); err != nil {
		t.Fatal(err)
	}
	if err := h.l.SetFleetView(0, 0, 0); err != nil {
		t.Fatal(err)
	}
	check("never a view", h, alone)

	// A view that holds.
	now, err := bpf.MonotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.l.SetFleetView(others, others, now+uint64(time.Hour)); err != nil {
		t.Fatal(err)
	}
	check("view holds", h, withOthers)

	// An expired view: the sums stay written and count for nothing.
	if err := h.l.SetFleetView(others, others, now-1); err != nil {
		t.Fatal(err)
	}
	check("view expired", h, alone)
	if in, tot, _ := h.l.FleetOthers(); in != others || tot != others {
		t.Errorf("the expired view's sums read %d, %d; want them kept, %d", in, tot, others)
	}

	// A view that expires while packets flow: the program itself finds
	// it expired at a CPU's next refresh.
	now, _ = bpf.MonotonicNow()
	if err := h.l.SetFleetView(others, others, now+uint64(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	check("before the expiry", h, withOthers)
	if d := time.Duration(now + uint64(2050*time.Millisecond) - mustNow(t)); d > 0 {
		time.Sleep(d)
	}
	check("after the expiry", h, alone)
	if _, _, stale, _ := h.l.FleetView(); !stale {
		t.Error("after the expiry the program did not mark the view stale")
	}

	// Without a fleet nothing changes: the multiplier is 1.
	if err := h.l.SetFleetFallback(1 << 16); err != nil {
		t.Fatal(err)
	}
	check("multiplier 1", h, func(r uint64) uint64 { return r })
	for _, bad := range []uint64{0, tiers.FleetMultMax + 1} {
		if err := h.l.SetFleetFallback(bad); err == nil {
			t.Errorf("SetFleetFallback(%d) took it", bad)
		}
	}
}

func mustNow(t *testing.T) uint64 {
	t.Helper()
	n, err := bpf.MonotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
