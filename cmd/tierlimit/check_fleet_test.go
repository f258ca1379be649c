package main

import (
	"strings"
	"testing"
)

// TestCheckFleet: with a fleet, check prints the tables for fleet.max, the
// fleet's pass rate at 0.5, 1, 2, 5 and 10 × fleet.max and what one member
// passes carrying 10 %, 50 % and 100 % of that load; the fallback it
// applies; with budgets, the max their percent is of. A bad fleet section
// exits 2 naming the key.
func TestCheckFleet(t *testing.T) {
	const src = "max: 1000\nwindow: 500ms\nfleet:\n  name: syslog-eu\n  store: redis://10.0.0.5:6379/0\n  max: 3000\n"
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"share", src, []string{
			"fleet.max 3000 selected packets per window for the whole fleet",
			"0 - [1, 2100) 0%", // the tiers at fleet.max
			"fleet syslog-eu: one budget of fleet.max 3000 per window",
			"reports every 100ms", "not heard from for 3s is out",
			"share, fleet.max ÷ the members last seen (1000 with 3 members)",
			"OFFERED R FLEET P(R) PASS RATE PASSED MEMBER AT 10 % MEMBER AT 50 % MEMBER AT 100 %",
			// max 3000: P(R) = 2099 + 300×0.8 + 600×0.5 = 2639 from 1 × on.
			"0.5 × fleet.max 1500 1500.0 3000/s 100.00% 150.0 of 150 750.0 of 750 1500.0 of 1500",
			"1 × fleet.max 3000 2639.0 5278/s 87.97% 263.9 of 300 1319.5 of 1500 2639.0 of 3000",
			"2 × fleet.max 6000 2639.0 5278/s 43.98% 263.9 of 600 1319.5 of 3000 2639.0 of 6000",
			"5 × fleet.max 15000 2639.0 5278/s 17.59% 263.9 of 1500 1319.5 of 7500 2639.0 of 15000",
			"10 × fleet.max 30000 2639.0 5278/s 8.80% 263.9 of 3000 1319.5 of 15000 2639.0 of 30000",
			"10 × max 30000 2639.0 263.9 5278/s 91.20%", // smooth's table, at fleet.max
		}},
		{"local", src + "  fallback: local\n  password_file: /etc/tl/pw\n", []string{
			"local, this policy's max 1000", "password: read from /etc/tl/pw"}},
		// Budgets in a fleet (docs/design.md §12): a percent of the
		// member's own max, not of fleet.max.
		{"sources", strings.Replace(src, "max: 3000", "max: 6000", 1) + "sources: {budget: 10%}\n", []string{
			"sources: budget 10% = 100 packets per window for each /32",
			"in fleet syslog-eu the budget is per member: 10% of this member's own max 1000, not of fleet.max 6000",
			"in fallback share, of fleet.max ÷ the members (200 packets with 3 members)",
			"each member reports R̂_in (its in-budget packets) and R̂_tot (all its packets)",
			"in-budget packets are judged at q(R̂_in + others_in), over-budget packets share P(R̂_tot + others_tot) − P(R̂_in + others_in)",
			"so the fleet passes P(R_fleet) as without budgets"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, raw, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", c.src))
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
			out := strings.Join(strings.Fields(raw), " ")
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("check output lacks %q:\n%s", w, raw)
				}
			}
		})
	}
	code, raw, _ := runCmd(t, "check", "--config", writeFile(t, "p.yaml", "max: 1000\n"))
	if code != 0 || strings.Contains(raw, "fleet") {
		t.Errorf("without a fleet: exit %d, output names a fleet:\n%s", code, raw)
	}
	for _, c := range []struct{ name, src, key string }{
		{"no name", "fleet: {store: redis://h, max: 10}\n", "fleet.name"},
		{"scheme", "fleet: {name: a, store: 'mongodb://h', max: 10}\n", "fleet.store"},
		{"report", "fleet: {name: a, store: redis://h, max: 10, report: 5s, ttl: 1s}\n", "fleet.report"},
		{"ordinal", "shape: ordinal\nfleet: {name: a, store: redis://h, max: 10}\n", "shape"},
		{"max", "fleet: {name: a, store: redis://h, max: 0}\n", "fleet.max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", c.src))
			if code != 2 || !strings.Contains(errs, c.key) {
				t.Errorf("exit %d, stderr %q; want 2 naming %s", code, errs, c.key)
			}
		})
	}
}

// TestCheckFleetOnset: check prints the fleet's first-window bound for 3
// and 30 members (docs/design.md §12, "The fleet's first second"), and
// warns when fleet.report is longer than window/10.
func TestCheckFleetOnset(t *testing.T) {
	const src = "max: 1000\nwindow: 1s\nfleet:\n  name: syslog-eu\n  store: redis://10.0.0.5:6379/0\n  max: 1000\n"
	warning := "warning: fleet.report 200ms is longer than window/10 (100ms)"
	for _, c := range []struct {
		name, src string
		warn      bool
	}{
		{"report 100ms", src + "  report: 100ms\n", false},
		{"report 200ms", src + "  report: 200ms\n", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, raw, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", c.src))
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
			out := strings.Join(strings.Fields(raw), " ")
			for _, w := range []string{"first window of a flood of 10 × fleet.max reaching every member at once from idle", "3 members:", "30 members:"} {
				if !strings.Contains(out, w) {
					t.Errorf("check output lacks %q:\n%s", w, raw)
				}
			}
			if got := strings.Contains(out, warning); got != c.warn {
				t.Errorf("check output has the warning %q: %v, want %v:\n%s", warning, got, c.warn, raw)
			}
		})
	}
}
