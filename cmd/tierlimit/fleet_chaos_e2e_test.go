package main

// Partitions (docs/design.md §12, Partitions; issue 40, item 9): k of the
// 3 members of TestFleetE2E's fleet cut off from the store by an nftables
// rule in their own namespaces, under the 60/30/10 flood.

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// chaosPolicy is e2ePolicy's fleet with fallback fb and a local max of
// localMax.
func chaosPolicy(store, fb string, localMax int) string {
	return fmt.Sprintf(`mode: enforce
shape: smooth
window: 1s
max: %d
tiers: [{at: 70%%, drop: 20%%}, {at: 80%%, drop: 50%%}, {at: 100%%, drop: 100%%}]
select: [{proto: udp, ports: [514]}]
fleet: {name: tlchaos, store: %q, max: %d, report: %s, ttl: %s, fallback: %s}
`, localMax, store, e2eFleetMax, e2eReport, e2eTTL, fb)
}

// TestFleetPartitionE2E: for each fallback, members 0.. k−1 (60 %, then
// 30 %, of 3 × fleet.max) are cut off from the store for 10 s (ten
// windows) and joined again. From ttl after the cut (two windows on) to
// its end, the fleet's total per window stays within docs/design.md §12's
// bound for the mode (tiers.FleetPartitionBound) + 5σ + 10 % (the
// pacing's noise), the cut members are in fallback and their view ages;
// within two windows of the heal every member is back (fleet_fallback 0).
// The first ttl is logged beside its bound, (1 + k) × C_M at worst.
func TestFleetPartitionE2E(t *testing.T) {
	testenv.Require(t)
	testenv.RequireRedis(t)
	if _, err := exec.LookPath("nft"); err != nil {
		msg := "nft, to cut members off from the store, is not installed (apt-get install nftables)"
		if os.Getenv(testenv.RequireEnv) == "1" {
			t.Fatalf("%s; required under %s=1", msg, testenv.RequireEnv)
		}
		t.Skip(msg)
	}
	bin := cli(t)
	for _, c := range []struct {
		fb       string
		k        int
		localMax int
	}{
		{"share", 1, 200}, {"share", 2, 200}, {"local", 1, 400}, {"last", 1, 200},
	} {
		t.Run(fmt.Sprintf("%s-k%d", c.fb, c.k), func(t *testing.T) {
			partition(t, bin, c.fb, c.k, c.localMax)
		})
	}
}

func partition(t *testing.T, bin, fb string, k, localMax int) {
	lab, rd := startFleetLab(t, "tlcut", bin, 3, labOpts{})
	cfg, err := lab.writePolicy("fleet.yaml", chaosPolicy(rd.URL(), fb, localMax))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := tiers.LoadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tab := mustTable(t, pol)
	for i := range lab.members {
		if err := lab.start(i, fmt.Sprintf("m%d", i), cfg, "joined the fleet"); err != nil {
			t.Fatal(err)
		}
	}
	R := 3 * e2eFleetMax
	rates := []int{R * 6 / 10, R * 3 / 10, R / 10}
	shares := []float64{0.6, 0.3, 0.1}
	const (
		first   = 300
		windows = 15
		cutAt   = 2  // the cut starts with this window
		healAt  = 12 // and ends with this one: 10 s
	)
	bound, err := tiers.FleetPartitionBound(pol, 3, shares[:k], uint64(R))
	if err != nil {
		t.Fatal(err)
	}
	cm := tab.Expected(uint64(R)).Passed
	start := time.Now()
	type floodResult struct {
		sent [][]int
		err  error
	}
	flooded := make(chan floodResult, 1)
	go func() {
		sent, err := lab.flood(context.Background(), first, windows, e2eWindow, func(int) []int { return rates })
		flooded <- floodResult{sent, err}
	}()
	time.Sleep(time.Until(start.Add(cutAt * e2eWindow)))
	for i := range k {
		if err := lab.cut(i, true); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Until(start.Add((healAt - 2) * e2eWindow)))
	for i := range k {
		if f := gauge(t, lab, i, "tierlimit_fleet_fallback"); f != 1 {
			t.Errorf("member %d cut off for 8 s: fleet_fallback %v, want 1", i, f)
		}
		if age := gauge(t, lab, i, "tierlimit_fleet_view_age_seconds"); age < 7 {
			t.Errorf("member %d cut off for 8 s: fleet_view_age_seconds %v, want about 8", i, age)
		}
	}
	time.Sleep(time.Until(start.Add(healAt * e2eWindow)))
	for i := range k {
		if err := lab.cut(i, false); err != nil {
			t.Fatal(err)
		}
	}
	healed := time.Now()
	// docs/design.md §12, Partitions: within ttl (the report or dial in
	// flight when the heal came), the backoff's cap (1 s) and go-redis's
	// probe of a failed address (once a second), with a report of margin.
	rejoin := e2eTTL + 2*time.Second + e2eReport
	back := allWithin(lab, rejoin, func(i int) bool { return gauge(t, lab, i, "tierlimit_fleet_fallback") == 0 })
	for i, d := range back {
		if d < 0 {
			t.Errorf("member %d still in fallback %v after the heal", i, rejoin)
		}
	}
	t.Logf("healed: every member out of fallback within %v", time.Since(healed).Round(10*time.Millisecond))
	res := <-flooded
	if res.err != nil {
		t.Fatal(res.err)
	}
	lab.settle(100 * time.Millisecond)
	sent := res.sent
	logWindows(t, fmt.Sprintf("%s, k %d", fb, k), lab, sent, first, tab)
	worst := 0.0
	for w := cutAt; w < healAt; w++ {
		pass, off := 0, 0
		for i := range lab.members {
			pass, off = pass+lab.passed(i, first+w), off+sent[i][w]
		}
		f := bound / float64(max(off, 1))
		sigma := math.Sqrt(float64(off) * f * (1 - math.Min(f, 1)))
		if w < cutAt+2 {
			t.Logf("window %d (the first ttl): fleet %d, bound at worst (1 + k) C_M = %.0f", w, pass, float64(1+k)*cm)
			continue
		}
		worst = math.Max(worst, float64(pass)/bound)
		if float64(pass) > bound+5*sigma+0.1*bound {
			t.Errorf("window %d, %d of 3 cut off, fallback %s: the fleet passed %d, over the bound %.0f + 5 × %.1f + 10%%", w, k, fb, pass, bound, sigma)
		}
	}
	t.Logf("fallback %s, %d of 3 cut off for 10 s: the fleet passed at most %.3f × the bound %.0f (C_M %.0f) after ttl", fb, k, worst, bound, cm)
}
