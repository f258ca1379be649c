package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestScrapeOneRead scrapes while a flood moves the tier, severity and
// over-budget counters, and checks that each scrape read the maps once and
// that all three families of it are that one read's values: two reads in
// one scrape (a second collector, or a feature that reads for itself) see
// different moments under traffic, and fail here.
func TestScrapeOneRead(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pol := policy(t, 1000)
	pol.Severity = &tiers.Severity{Protect: []int{0, 1, 2, 3}, ProtectBudget: tiers.Pct(5), ShedFirst: []int{7}}
	pol.Sources = tiers.Sources{Budget: tiers.Pct(80), PrefixV4: 32, PrefixV6: 64}
	a := startAgent(t, p, agent.XDPAuto, pol)
	tx := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")
	if t.Failed() {
		t.FailNow()
	}
	coll, reads := agent.CollectorCountingReads(a)

	// One source, about 5000 datagrams a window: 800 in budget, which
	// reach tier 1, and the rest over budget; PRIs crit, info, debug.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		_, err := tx.Pace(ctx, 25000, 5*time.Second, 6*time.Second, func(i int) []byte {
			return fmt.Appendf(nil, "<%d>1 2026-11-29T17:00:00.000Z sender tltest 4242 ID47 - seq=%d", []int{priCrit, priInfo, priDebug}[i%3], i)
		})
		sent <- err
	}()

	const scrapes = 40
	moved := 0
	var prev bpf.Stats
	for i := range scrapes {
		got := gatherFrom(t, coll)
		stats, other := reads.Take()
		if len(stats) != 1 || other != 3 {
			t.Fatalf("scrape %d read the per-CPU stats %d times and the other maps %d times; want once and 3 (policy, window, source table)", i, len(stats), other)
		}
		st := stats[0]
		for _, v := range tiers.Verdicts {
			checkSeries(t, i, got, fmt.Sprintf(`tierlimit_source_over_budget_packets_total{verdict=%q}`, v), st.OverBudget[v].Packets)
			for _, c := range tiers.SeverityClasses {
				checkSeries(t, i, got, fmt.Sprintf(`tierlimit_severity_packets_total{class=%q,verdict=%q}`, c, v), st.Severity[c][v].Packets)
			}
			for tier := range 2 {
				checkSeries(t, i, got, fmt.Sprintf(`tierlimit_selected_packets_total{tier=%q,verdict=%q}`, strconv.Itoa(tier), v), st.Selected[tier][v].Packets)
			}
		}
		if i > 0 && st != prev {
			moved++
		}
		prev = st
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-sent; err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	if moved < scrapes/2 {
		t.Errorf("the counters moved between %d of %d scrapes: the traffic did not flow while scraping", moved, scrapes-1)
	}
	if prev.OverBudget[tiers.VerdictDrop].Packets == 0 || prev.Selected[1][tiers.VerdictDrop].Packets == 0 ||
		prev.Severity[tiers.SevProtected][tiers.VerdictPass].Packets == 0 {
		t.Errorf("the flood did not reach every family: over budget %+v, tier 1 %+v, severity %+v", prev.OverBudget, prev.Selected[1], prev.Severity)
	}
}

func checkSeries(t *testing.T, scrape int, got metrics, key string, want uint64) {
	t.Helper()
	if v, ok := got[key]; !ok || v != float64(want) {
		t.Errorf("scrape %d: %s = %v (present %v), but the scrape's one read of the maps says %d", scrape, key, v, ok, want)
	}
}
