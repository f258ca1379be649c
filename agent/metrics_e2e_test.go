package agent_test

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
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
	a := startAgent(t, p, attach.XDPAuto, pol)
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

// TestMetrics lints the collector's output with client_golang's testutil,
// registers it in a pedantic registry, and checks that /metrics has every
// metric of docs/design.md §5 with its type and the policy's values.
func TestMetrics(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pol := policy(t, 2000)
	a := startAgent(t, p, attach.XDPAuto, pol)
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")
	tx := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	if _, err := tx.Pace(context.Background(), 50, 10*time.Millisecond, time.Second, func(i int) []byte { return testenv.SyslogMessage(0, i) }); err != nil {
		t.Fatal(err)
	}
	waitSelected(t, a, 50)

	problems, err := testutil.CollectAndLint(a.Collector())
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint (collector): %s: %s", pr.Metric, pr.Text)
	}
	problems, err = testutil.GatherAndLint(a.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint (registry): %s: %s", pr.Metric, pr.Text)
	}

	m := gather(t, a) // a pedantic registry
	_, body := scrape(t, a, "/metrics")
	for _, c := range []struct{ name, typ string }{
		{"selected_packets_total", "counter"}, {"selected_bytes_total", "counter"},
		{"unselected_packets_total", "counter"}, {"exempt_packets_total", "counter"},
		{"window_packets", "gauge"}, {"last_window_packets", "gauge"}, {"current_tier", "gauge"},
		{"policy_max_packets", "gauge"}, {"policy_tier_threshold_packets", "gauge"}, {"policy_tier_drop_ratio", "gauge"},
		{"config_reloads_total", "counter"}, {"xdp_attached", "gauge"}, {"scrape_errors_total", "counter"},
		{"malformed_packets_total", "counter"},
		{"unclassified_packets_total", "counter"},
	} {
		name := "tierlimit_" + c.name
		if !strings.Contains(body, "# TYPE "+name+" "+c.typ+"\n") || !strings.Contains(body, "# HELP "+name+" ") {
			t.Errorf("/metrics lacks %s of type %s with help", name, c.typ)
		}
	}
	for key, want := range map[string]float64{
		"tierlimit_policy_max_packets":                              2000,
		`tierlimit_policy_tier_threshold_packets{tier="1"}`:         1400,
		`tierlimit_policy_tier_threshold_packets{tier="2"}`:         1600,
		`tierlimit_policy_tier_threshold_packets{tier="3"}`:         2000,
		`tierlimit_policy_tier_drop_ratio{tier="0"}`:                0,
		`tierlimit_policy_tier_drop_ratio{tier="1"}`:                0.2,
		`tierlimit_policy_tier_drop_ratio{tier="2"}`:                0.5,
		`tierlimit_policy_tier_drop_ratio{tier="3"}`:                1,
		`tierlimit_selected_packets_total{tier="0",verdict="pass"}`: 50,
		"tierlimit_current_tier":                                    0,
		"tierlimit_scrape_errors_total":                             0,
		`tierlimit_malformed_packets_total{reason="udp_length"}`:    0,
		`tierlimit_malformed_packets_total{reason="tiny_fragment"}`: 0,
		`tierlimit_malformed_packets_total{reason="ipv4_checksum"}`: 0,
		`tierlimit_unclassified_packets_total{reason="ipv6_chain"}`: 0,
		`tierlimit_config_reloads_total{result="success"}`:          0,
	} {
		// Drop ratios are on the 2^32 scale of bpf_get_prandom_u32.
		if got, ok := m[key]; !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	// The window is open (n = 50), or expired if this ran for over 1 s.
	if cur, last := m["tierlimit_window_packets"], m["tierlimit_last_window_packets"]; !(cur == 50 || cur == 0 && last == 50) {
		t.Errorf("window_packets %.0f, last_window_packets %.0f, want 50 in one of them", cur, last)
	}
	if got := m.sum("tierlimit_selected_bytes_total", `tier="0"`, `verdict="pass"`); got < 50*60 {
		t.Errorf("selected_bytes_total{tier=0,pass} = %.0f for 50 datagrams of 80+ bytes", got)
	}
}
