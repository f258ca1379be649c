package main

import (
	"strings"
	"testing"
)

// TestCheckShape: check prints the shape; for smooth, the pass rate at
// 0.5, 1, 2, 5 and 10 × max with q(R), and the estimator with its
// constants; with sources, the sharing rule, and for ordinal the bound of
// T_1 beyond P(R). A .properties config gets smooth.
func TestCheckShape(t *testing.T) {
	smooth := []string{"shape smooth", "smooth pass rate", "q(R)",
		// max 1000: P(R) = 699 + 100×0.8 + 200×0.5 = 879 from 1 × max on
		// (n = 1..699 in tier 0), 1758 per second in 500 ms windows.
		"0.5 × max 500 500.0 50.0 1000/s 0.00%", "1 × max 1000 879.0 87.9 1758/s 12.10%",
		"5 × max 5000 879.0 87.9 1758/s 82.42%", "10 × max 10000 879.0 87.9 1758/s 91.21%",
		"sliding window count", "n ≥ 16", "recent rate over a window", "5/4 × S", "once per tick",
		"bursts: a burst at more than 5/4", "past T_1 = 700", "at least 200ms"}
	ordinal := []string{"shape ordinal", "by its position n"}
	sharing := []string{"sharing:", "P(R_in + R_ex) − P(R_in)", "window passes P(R_in + R_ex), as without budgets", "light groups lose nothing"}
	bound := []string{"max(n, expect_in) + its rank", "expect_in = 0", "arrives before its in-budget traffic", "up to T_1 = 700 packets more than P(R_in + R_ex)",
		"the over-budget positions start after the previous window's in-budget count"}
	smoothShare := []string{"(P(R̂_in + R̂_ex) − P(R̂_in)) / R̂_ex"}
	for _, c := range []struct {
		name, file, src string
		want, not       [][]string
	}{
		{"smooth", "p.yaml", "max: 1000\nwindow: 500ms\n", [][]string{smooth}, [][]string{ordinal, sharing, bound}},
		{"ordinal", "p.yaml", "max: 1000\nwindow: 500ms\nshape: ordinal\n", [][]string{ordinal}, [][]string{smooth, sharing}},
		{"smooth sources", "p.yaml", "max: 1000\nwindow: 500ms\nsources: {budget: 10%}\n", [][]string{smooth, sharing, smoothShare}, [][]string{bound}},
		{"ordinal sources", "p.yaml", "max: 1000\nwindow: 500ms\nshape: ordinal\nsources: {budget: 10%}\n", [][]string{ordinal, sharing, bound}, [][]string{smooth, smoothShare}},
		{"properties", "limiter.properties", "limiter.max=1000\n", [][]string{{"shape smooth", "10 × max 10000 879.0 87.9"}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, raw, errs := runCmd(t, "check", "--config", writeFile(t, c.file, c.src))
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
			// Compare with columns and wrapped lines joined by one space.
			out := strings.Join(strings.Fields(raw), " ")
			for _, ws := range c.want {
				for _, w := range ws {
					if !strings.Contains(out, w) {
						t.Errorf("check output lacks %q:\n%s", w, raw)
					}
				}
			}
			for _, ns := range c.not {
				for _, n := range ns {
					if strings.Contains(out, n) {
						t.Errorf("check output has %q:\n%s", n, raw)
					}
				}
			}
		})
	}
}

// TestCheckShortWindow: check refuses shape smooth with a window under
// tiers.SmoothMinWindow, saying why and what to do (docs/design.md §9 property
// 5), and takes the window ordinal.
func TestCheckShortWindow(t *testing.T) {
	code, _, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", "max: 1000\nwindow: 10ms\n"))
	if code == 0 || !strings.Contains(errs, "shape smooth needs a window of at least 200ms") || !strings.Contains(errs, "shape: ordinal") {
		t.Errorf("smooth 10ms: exit %d, stderr %q; want a refusal naming 200ms and shape: ordinal", code, errs)
	}
	if code, _, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", "max: 1000\nwindow: 10ms\nshape: ordinal\n")); code != 0 {
		t.Errorf("ordinal 10ms: exit %d, stderr %q", code, errs)
	}
}
