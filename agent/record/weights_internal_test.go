package record

import (
	"context"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestEpisodeWeights drives the tracker with counters by severity class
// and over budget, and parses the reports back: each carries the pass
// fractions of its span, equal to the counters' (passed, and would_drop,
// over offered), its span's bounds, and the state file keeps the last.
func TestEpisodeWeights(t *testing.T) {
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := tiers.Default()
	p.Severity = &tiers.Severity{Protect: []int{2}, ProtectBudget: tiers.Pct(5), ShedFirst: []int{7}, ProtectFacilities: []int{4}}
	p.Events = tiers.Events{Network: "udp", Addr: ln.LocalAddr().String(), SummaryEvery: 2 * time.Second}
	state := filepath.Join(t.TempDir(), "episode.json")
	e := newEpisodes(slog.New(slog.DiscardHandler), nil, nil, p, func() []string { return []string{"veth0"} }, state)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.send.run(ctx)

	// One window's counts: per class pass/drop, over budget pass/drop.
	type window struct{ prot, protDrop, norm, normDrop, shed, shedDrop, over, overDrop uint64 }
	var st bpf.Stats
	now := time.Now()
	add := func(w window) {
		st.Severity[tiers.SevProtected][tiers.VerdictPass].Packets += w.prot
		st.Severity[tiers.SevProtected][tiers.VerdictDrop].Packets += w.protDrop
		st.Severity[tiers.SevNormal][tiers.VerdictPass].Packets += w.norm
		st.Severity[tiers.SevNormal][tiers.VerdictDrop].Packets += w.normDrop
		st.Severity[tiers.SevShedFirst][tiers.VerdictPass].Packets += w.shed
		st.Severity[tiers.SevShedFirst][tiers.VerdictDrop].Packets += w.shedDrop
		st.Selected[1][tiers.VerdictPass].Packets += w.prot + w.norm + w.shed
		st.Selected[1][tiers.VerdictDrop].Packets += w.protDrop + w.normDrop + w.shedDrop
		st.OverBudget[tiers.VerdictPass].Packets += w.over
		st.OverBudget[tiers.VerdictDrop].Packets += w.overDrop
		now = now.Add(time.Second)
		e.tick(now, st)
	}
	add(window{})                                                                                                // first read
	add(window{prot: 50, norm: 300, shed: 100})                                                                  // nothing shed
	add(window{prot: 49, protDrop: 1, norm: 400, normDrop: 600, shed: 10, shedDrop: 290, over: 3, overDrop: 97}) // opens
	add(window{prot: 60, norm: 200, normDrop: 700, shedDrop: 300, overDrop: 50})
	add(window{prot: 40, norm: 100, normDrop: 300, shed: 5, shedDrop: 95, over: 10, overDrop: 10}) // summary: the two windows since open
	// open: the opening window; summary: the two after it.
	want := []struct {
		event                       string
		all, prot, norm, shed, over [2]uint64 // passed, offered
	}{
		{"open", [2]uint64{49 + 400 + 10 + 3, 50 + 1000 + 300 + 100}, [2]uint64{49, 50}, [2]uint64{400, 1000}, [2]uint64{10, 300}, [2]uint64{3, 100}},
		{"summary", [2]uint64{60 + 200 + 40 + 100 + 5 + 10, 60 + 900 + 300 + 50 + 40 + 400 + 100 + 20}, [2]uint64{100, 100}, [2]uint64{300, 1300}, [2]uint64{5, 400}, [2]uint64{10, 70}},
	}
	buf := make([]byte, 8192)
	var lastTo time.Time
	for _, w := range want {
		ln.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := ln.ReadFrom(buf)
		if err != nil {
			t.Fatalf("%s: %v", w.event, err)
		}
		m, err := parseRFC5424(string(buf[:n]))
		if err != nil {
			t.Fatal(err)
		}
		if m.params["event"] != w.event {
			t.Fatalf("report %q, want %s", m.params["event"], w.event)
		}
		for _, c := range []struct {
			param string
			f     [2]uint64
		}{{"pass_frac", w.all}, {"pass_frac_protected", w.prot}, {"pass_frac_normal", w.norm}, {"pass_frac_shed_first", w.shed}, {"pass_frac_over_budget", w.over}} {
			got, err := strconv.ParseFloat(m.params[c.param], 64)
			exact := float64(c.f[0]) / float64(c.f[1])
			if err != nil || math.Abs(got-exact) > 5e-6*exact {
				t.Errorf("%s: %s=%q, want %d/%d = %.6g", w.event, c.param, m.params[c.param], c.f[0], c.f[1], exact)
			}
		}
		if m.params["passed"] != strconv.FormatUint(w.all[0], 10) || m.params["offered"] != strconv.FormatUint(w.all[1], 10) {
			t.Errorf("%s: passed %s offered %s, want %d %d", w.event, m.params["passed"], m.params["offered"], w.all[0], w.all[1])
		}
		from, err1 := time.Parse(time.RFC3339Nano, m.params["weights_from"])
		to, err2 := time.Parse(time.RFC3339Nano, m.params["weights_to"])
		if err1 != nil || err2 != nil || !to.After(from) || !lastTo.IsZero() && !from.Equal(lastTo) {
			t.Errorf("%s: span %q to %q, want one that starts where the last ended (%v)", w.event, m.params["weights_from"], m.params["weights_to"], lastTo)
		}
		lastTo = to
	}
	saved, err := ReadEpisode(state)
	if err != nil || saved.Weights == nil || saved.Weights.Classes["shed_first"] != (Fraction{Passed: 5, Offered: 400}) ||
		saved.Weights.OverBudget.Weight() != 7 {
		t.Errorf("state file weights %+v, %v", saved.Weights, err)
	}
}

// TestPassEstimate: a group's pass fraction from its shed samples'
// pass probabilities (Horvitz–Thompson): samples at q = 0.75 stand for 4
// judged each, so 3 of 4 passed; at q = 0 all were shed.
func TestPassEstimate(t *testing.T) {
	rec := &Recorder{log: slog.New(slog.DiscardHandler), groups: map[netip.Prefix]uint64{}}
	g1, g2 := netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("10.0.2.0/24")
	for i := range 30 {
		s := testSample(i)
		s.Format, s.Group, s.Pass = bpf.SampleFormat, g1, 3<<30 // 0.75
		if i%3 == 0 {
			s.Group, s.Pass = g2, 0
		}
		rec.keep(s)
	}
	top, n := rec.topGroups(5)
	if n != 30 || len(top) != 2 || top[0].Group != g1 || top[0].PassEst == nil || math.Abs(*top[0].PassEst-0.75) > 1e-9 ||
		top[1].PassEst == nil || *top[1].PassEst != 0 {
		t.Fatalf("top %+v", top)
	}
	if p := weightParams(&Weights{}, top); p[len(p)-1] != (sdParam{"pass_est_top", "10.0.1.0/24:0.75,10.0.2.0/24:0"}) {
		t.Errorf("params %v", p)
	}
}
