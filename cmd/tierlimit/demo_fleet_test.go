package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestDemoFleet runs `tierlimit demo --fleet 3` as a function, its members
// the built binary: four windows at 3 × fleet.max split 60/30/10; from the
// third window on, the fleet's passes are within 25 % of the model's
// P(R_fleet) (the demo's pacing and its windows' alignment with the
// members' are the imprecision, as in TestDemo), and the sandbox is gone
// afterwards (demoCLI).
func TestDemoFleet(t *testing.T) {
	testenv.Require(t)
	testenv.RequireRedis(t)
	out, _ := demoCLI(t, "--fleet", "3", "--fleet-bin", cli(t), "--max", "300", "--window", "1s", "--loads", "3,3,3,3")
	var rows [][]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 9 {
			if _, err := strconv.Atoi(f[0]); err == nil {
				rows = append(rows, f)
			}
		}
	}
	if len(rows) != 4 {
		t.Fatalf("%d window rows, want 4:\n%s", len(rows), out)
	}
	num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
	for k, r := range rows {
		for i, want := range []string{"540", "270", "90"} {
			if _, off, _ := strings.Cut(r[2+i], "/"); off != want {
				t.Errorf("window %d: m%d offered %s, want %s", k+1, i, off, want)
			}
		}
		if r[5] != "900" {
			t.Errorf("window %d: the fleet offered %s, want 900", k+1, r[5])
		}
		if pass, model := num(r[6]), num(r[7]); k >= 2 && (pass < 0.75*model || pass > 1.25*model) {
			t.Errorf("window %d: the fleet passed %v, want the model's %v ± 25%%", k+1, pass, model)
		}
	}
	for _, want := range []string{"redis://10.77.0.1:6379", "fleet.max 300", "60/30/10"} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	// --fleet takes 2..8 members and no other demo.
	for _, args := range [][]string{{"demo", "--fleet", "1"}, {"demo", "--fleet", "9"}, {"demo", "--fleet", "3", "--auto"}} {
		if code, _, _ := runCmd(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}

// TestDemoFleetChaos runs `tierlimit demo --fleet 3 --chaos`: six windows
// at 3 × fleet.max split 60/30/10, m0 cut off from the store in windows
// 2..5. The table marks those windows, the first ttl's apart, and each
// window after the cut's first ttl passes within 25 % over its bound,
// the partition bound of fallback share, (1 + 1/3) × C_M (the demo's
// pacing as in TestDemoFleet); without --fleet --chaos is refused.
func TestDemoFleetChaos(t *testing.T) {
	testenv.Require(t)
	testenv.RequireRedis(t)
	out, _ := demoCLI(t, "--fleet", "3", "--chaos", "--fleet-bin", cli(t), "--max", "300", "--window", "1s", "--loads", "3,3,3,3,3,3")
	var rows [][]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 9 {
			if _, err := strconv.Atoi(f[0]); err == nil {
				rows = append(rows, f)
			}
		}
	}
	if len(rows) != 6 {
		t.Fatalf("%d window rows, want 6:\n%s", len(rows), out)
	}
	num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
	for k, r := range rows {
		want := "joined"
		switch {
		case k == 1:
			want = "m0-cut-ttl"
		case k >= 2 && k < 5:
			want = "m0-cut"
		}
		if r[5] != want {
			t.Errorf("window %d: store %q, want %q", k+1, r[5], want)
		}
		if want == "m0-cut" {
			// (1 + 1/3) × 0.88 × 300 = 352
			if b := num(r[8]); b < 345 || b > 355 {
				t.Errorf("window %d: bound %v, want (1 + 1/3) × C_M = 352", k+1, b)
			}
			if pass := num(r[7]); pass > 1.25*num(r[8]) {
				t.Errorf("window %d: the fleet passed %v, over the bound %v + 25%%", k+1, pass, num(r[8]))
			}
		}
	}
	if !strings.Contains(out, "fallback share") {
		t.Errorf("the demo's output does not name the fallback:\n%s", out)
	}
	if code, _, _ := runCmd(t, "demo", "--chaos"); code != 2 {
		t.Errorf("demo --chaos without --fleet: exit %d, want 2", code)
	}
}
