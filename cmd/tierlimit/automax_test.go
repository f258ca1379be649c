package main

import (
	"strings"
	"testing"
)

func TestCheckAuto(t *testing.T) {
	path := writeFile(t, "auto.yaml", "max: auto\nauto:\n  start: 20000\n  floor: 500\n  ceiling: 90000\n")
	code, out, errs := runCmd(t, "check", "--config", path)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{
		"auto: starts at 20000, moves within [500, 90000]",
		"max × max(0.7, 1 − D/P)", "not below 500",
		"2 windows in a row without socket drops while shedding: max + 200 (start/100)", "up to 3200; not above 90000",
		"no change while nothing is shed", "keeps the learnt max",
		"[1, 14000)", // the tables are at start
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("\n%s", out)

	for _, c := range []struct{ name, src, want string }{
		{"floor over start", "max: auto\nauto:\n  start: 100\n  floor: 200\n", `line 4: auto.floor: "200": bad auto settings: floor must be at most start (100)`},
		{"properties", "limiter.max=auto\n", `line 1: limiter.max: "auto": bad auto settings`},
	} {
		name := "p.yaml"
		if c.name == "properties" {
			name = "p.properties"
		}
		code, _, errs := runCmd(t, "check", "--config", writeFile(t, name, c.src))
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stderr %q, want 2 and %q", c.name, code, errs, c.want)
		}
	}
}
