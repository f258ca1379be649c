package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/tiers"
)

// demoSeverity is the severity block of `demo --severity` (docs/design.md §7).
var demoSeverity = tiers.Severity{Protect: []int{0, 1, 2, 3}, ProtectBudget: tiers.Pct(5), ShedFirst: []int{7}}

// demoMix is the flood of `demo --severity`, by syslog PRI: 1% user.crit,
// 49% user.info, 50% user.debug.
var demoMix = []struct {
	pri     int
	percent int
}{{10, 1}, {14, 49}, {15, 50}}

// runSeverityDemo floods the sandbox with a mix of severities, one window
// per load, and prints per window how much of each class got through.
func runSeverityDemo(ctx context.Context, g *globals, f demoFlags) error {
	if os.Geteuid() != 0 {
		return agent.ErrNotRoot
	}
	pol, err := demoPolicy(f)
	if err != nil {
		return err
	}
	sev := demoSeverity
	pol.Severity = &sev
	if err := pol.Validate(); err != nil {
		return configError{err}
	}
	r, err := newDemoRig(g, pol)
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Fprintf(g.stdout, "sandbox: %s <-veth-> %s\npolicy: %s\nseverity: %s\nflood: 1%% <10> user.crit, 49%% <14> user.info, 50%% <15> user.debug, shuffled\n\n",
		r.pair.SendIf, r.pair.CollIf, pol.String(), pol.Severity)
	fmt.Fprintf(g.stdout, "%6s %8s %6s %8s %9s  %14s %14s %14s %10s\n",
		"window", "offered", "× max", "passed", "no-sev", "crit pass", "info pass", "debug pass", "protected")
	rng := rand.New(rand.NewPCG(1, 2))
	pris := make([][]int, len(f.loads))
	for i, load := range f.loads {
		pris[i] = severityMix(rng, int(load*float64(pol.Max)))
	}
	msg := func(i, seq int) []byte {
		return fmt.Appendf(nil, "<%d>1 2026-11-30T00:00:00Z sender demo - - - burst=%d seq=%d", pris[i][seq], i, seq)
	}
	return r.windows(ctx, pol, f.loads, func(i int, load float64, w *demoWindow) error {
		return r.severityWindow(g, pol, pris[i], i, load, w)
	}, msg)
}

// severityMix returns offered syslog PRIs in demoMix's proportions,
// shuffled.
func severityMix(rng *rand.Rand, offered int) []int {
	pris := make([]int, 0, offered)
	for _, m := range demoMix {
		for range offered * m.percent / 100 {
			pris = append(pris, m.pri)
		}
	}
	for len(pris) < offered {
		pris = append(pris, 15)
	}
	rng.Shuffle(len(pris), func(a, b int) { pris[a], pris[b] = pris[b], pris[a] })
	return pris
}

// severityWindow prints window i, whose datagrams had PRIs pris: the
// passes by class, from the program's counters, beside what the tiers
// alone would pass.
func (r *demoRig) severityWindow(g *globals, pol tiers.Policy, pris []int, i int, load float64, w *demoWindow) error {
	offered := len(pris)
	before, after := w.before, w.after
	e, err := tiers.Expected(pol, uint64(offered))
	if err != nil {
		return err
	}
	sent := map[tiers.SeverityClass]int{}
	for _, p := range pris {
		sent[pol.Severity.ClassOf(p%8)]++
	}
	pass := func(c tiers.SeverityClass) string {
		n := after.Severity[c][tiers.VerdictPass].Packets - before.Severity[c][tiers.VerdictPass].Packets
		return fmt.Sprintf("%d/%d", n, sent[c])
	}
	fmt.Fprintf(g.stdout, "%6d %8d %6.1f %8d %9.0f  %14s %14s %14s %10d\n", i+1, offered, load, w.received, e.Passed,
		pass(tiers.SevProtected), pass(tiers.SevNormal), pass(tiers.SevShedFirst),
		after.ProtectedPass.Packets-before.ProtectedPass.Packets)
	return nil
}
