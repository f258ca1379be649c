package main

// A pinned program never judges on a stale view (docs/design.md §12, "A
// view that expires"; issue 40, item 8): the fleet of TestFleetE2E with
// its members pinned, so that a member's program outlives its agent.

import (
	"context"
	"fmt"
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestFleetPinnedE2E: three pinned members under 3 × fleet.max split
// 60/30/10, one window a second.
//
//   - SIGKILL of member 0 (60 %): its program goes on with no agent. From
//     ttl after its last report it judges alone on the fallback, share of
//     the 3 members last seen (fleet.max ÷ 3): each full window after
//     passes P_{M/3}(its offered), within 5σ + 10 %. (Before, it went on
//     judging on the frozen others' sum: 0.6 × P_M(R_fleet), 1.8 × that.)
//     The survivors' shortfall until they drop its entry (ttl) is logged:
//     the window of the kill against what they pass once it is out.
//   - SIGTERM of member 1 (30 %): it leaves the store and its program
//     judges alone at once, on share of the 2 members it last saw: each
//     full window after passes P_{M/2}(its offered). (Before: 0.75 ×
//     P_M(720), 1.5 × that.)
//   - Member 0 started again adopts its pins and rejoins the fleet.
//
// The fleet's total while member 0 is alone is logged against the
// partition bound of docs/design.md §12 for share with k = 1 of N = 3,
// (1 + 1/3) × P_M(∞).
func TestFleetPinnedE2E(t *testing.T) {
	testenv.Require(t)
	testenv.RequireRedis(t)
	bin := cli(t)
	lab, rd := startFleetLab(t, "tlpin", bin, 3, labOpts{pinned: true})
	cfg, err := lab.writePolicy("fleet.yaml", e2ePolicy(rd.URL(), true))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := tiers.LoadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tab := mustTable(t, pol)
	share3, share2 := mustTable(t, pol.FleetFallbackPolicy(3)), mustTable(t, pol.FleetFallbackPolicy(2))
	for i := range lab.members {
		if err := lab.start(i, fmt.Sprintf("m%d", i), cfg, "joined the fleet"); err != nil {
			t.Fatal(err)
		}
	}
	R := 3 * e2eFleetMax
	rates := []int{R * 6 / 10, R * 3 / 10, R / 10}
	const (
		first   = 200
		windows = 12
		kill    = 3 // member 0 is killed at the start of this window
		term    = 8 // member 1 is stopped at the start of this window
	)
	ctx := context.Background()
	start := time.Now()
	type floodResult struct {
		sent [][]int
		err  error
	}
	flooded := make(chan floodResult, 1)
	go func() {
		sent, err := lab.flood(ctx, first, windows, e2eWindow, func(int) []int { return rates })
		flooded <- floodResult{sent, err}
	}()
	time.Sleep(time.Until(start.Add(kill * e2eWindow)))
	killed := time.Now()
	if err := lab.stop(0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(start.Add(term * e2eWindow)))
	if err := lab.stop(1, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lab.logOf(1), "stopped") && !strings.Contains(lab.logOf(1), "left") {
		t.Logf("member 1's log at SIGTERM:\n%s", lab.logOf(1))
	}
	res := <-flooded
	if res.err != nil {
		t.Fatal(res.err)
	}
	lab.settle(100 * time.Millisecond)
	sent := res.sent
	logWindows(t, "pinned fleet", lab, sent, first, tab)
	t.Logf("member 0 killed %v after the flood's start", killed.Sub(start).Round(time.Millisecond))

	// within checks member i's passes in window k against want(offered).
	within := func(what string, i, k int, want tiers.Table) {
		t.Helper()
		off, got := sent[i][k], lab.passed(i, first+k)
		w := want.Expected(uint64(off)).Passed
		f := w / float64(max(off, 1))
		sigma := math.Sqrt(float64(off) * f * (1 - f))
		t.Logf("%s, window %d: member %d passed %d of %d, want %.0f ± (5 × %.1f + 10%%)", what, k, i, got, off, w, sigma)
		if math.Abs(float64(got)-w) > 5*sigma+0.1*w {
			t.Errorf("%s, window %d: member %d passed %d of %d, want %.0f ± (5 × %.1f + 10%%)", what, k, i, got, off, w, sigma)
		}
	}
	// Member 0's view expired ttl after its last report, within window
	// kill+1: the windows from kill+2 on are the fallback's.
	for k := kill + 2; k < windows; k++ {
		within("member 0 killed, alone on share of 3", 0, k, share3)
	}
	for k := term + 1; k < windows; k++ {
		within("member 1 stopped, alone on share of 2", 1, k, share2)
	}
	// The survivors' shortfall: in the kill's window they still count
	// member 0's last estimate; once it is out (ttl) they pass
	// P_M(their own).
	surv := func(k int) (pass, off int) {
		for i := 1; i < 3; i++ {
			pass, off = pass+lab.passed(i, first+k), off+sent[i][k]
		}
		return pass, off
	}
	p3, o3 := surv(kill)
	p5, o5 := surv(kill + 2)
	t.Logf("survivors: window %d (member 0's entry still counted until ttl) passed %d of %d; window %d (it is out) %d of %d, P_M(own) %.0f: a shortfall of %.0f%% for ttl",
		kill, p3, o3, kill+2, p5, o5, tab.Expected(uint64(o5)).Passed, 100*(1-float64(p3)/math.Max(float64(p5), 1)))
	total := 0
	for i := range lab.members {
		total += lab.passed(i, first+kill+2)
	}
	bound := (1 + 1.0/3) * tab.Expected(1<<30).Passed
	t.Logf("fleet total in window %d, member 0 alone: %d; the partition bound for share, k = 1 of 3: %.0f", kill+2, total, bound)
	if float64(total) > 1.1*bound {
		t.Errorf("fleet total %d over the bound %.0f (+10%%)", total, bound)
	}

	// Member 0 again: it adopts its pins and rejoins.
	if err := lab.start(0, "m0", cfg, "joined the fleet"); err != nil {
		t.Fatal(err)
	}
}

func mustTable(t *testing.T, p tiers.Policy) tiers.Table {
	t.Helper()
	tab, err := tiers.Compile(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}
