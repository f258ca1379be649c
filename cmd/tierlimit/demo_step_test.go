package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestDemoLoadsStep: --loads L@φ reads a step at phase φ of the window
// (issue 39 item 5); bad input is a usage error (exit 2) naming the flag
// and the value, before anything runs.
func TestDemoLoadsStep(t *testing.T) {
	f := demoFlags{max: 1000, window: 1e9}
	if err := f.parse("0.5,0.5,10@0.6,10", "smooth"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.loads, []float64{0.5, 0.5, 10, 10}) || !slices.Equal(f.steps, []float64{0, 0, 0.6, 0}) {
		t.Errorf("loads %v, steps %v; want [0.5 0.5 10 10], [0 0 0.6 0]", f.loads, f.steps)
	}
	f = demoFlags{max: 1000, window: 1e9}
	if err := f.parse("0.5,10", "smooth"); err != nil || f.steps != nil {
		t.Errorf("no step: steps %v, error %v; want nil, nil", f.steps, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--loads", "0.5,10@1.5"}, `"10@1.5"`},
		{[]string{"--loads", "0.5,10@0"}, `"10@0"`},
		{[]string{"--loads", "0.5,10@x"}, `"x"`},
		{[]string{"--loads", "0.5,10@"}, `"10@"`},
		{[]string{"--loads", "0.5,@0.6"}, `"@0.6"`},
		{[]string{"--loads", "0.5,10@0.6", "--severity"}, "--loads"},
		{[]string{"--loads", "0.5,10@0.6", "--fleet", "3"}, "--loads"},
	} {
		code, _, errs := runCmd(t, append([]string{"demo"}, c.args...)...)
		if code != exitUsage || !strings.Contains(errs, "--loads") || !strings.Contains(errs, c.want) {
			t.Errorf("demo %q: exit %d, stderr %q; want %d naming --loads and %s", c.args, code, errs, exitUsage, c.want)
		}
	}
}

// TestDemoStep runs `tierlimit demo --loads 0.5,0.5,10@0.6,10`: the third
// window offers 0.5 × max until 0.6 of it, then 10 × max (0.5 × 0.6 + 10 ×
// 0.4 = 4.3 × max), and each row ends with its tenths: ten counts that sum
// to what the collector received of the window.
func TestDemoStep(t *testing.T) {
	out, _ := demoCLI(t, "--max", "300", "--window", "1s", "--loads", "0.5,0.5,10@0.6,10")
	if !strings.Contains(out, "tenths") {
		t.Errorf("no tenths column:\n%s", out)
	}
	rows := demoRows(out)
	if len(rows) != 4 {
		t.Fatalf("want 4 window rows:\n%s", out)
	}
	if rows[2][1] != "1290" || rows[2][2] != "4.3" {
		t.Errorf("the step's window: row %v, want 1290 offered, 4.3 × max", rows[2])
	}
	for _, r := range rows {
		var sum int
		parts := strings.Split(r[len(r)-1], ",")
		for _, p := range parts {
			v, err := strconv.Atoi(p)
			if err != nil {
				t.Fatalf("row %v: tenths %q", r, r[len(r)-1])
			}
			sum += v
		}
		if len(parts) < 10 || strconv.Itoa(sum) != r[3] {
			t.Errorf("row %v: tenths %q sum to %d, want %d tenths or more summing to the passes %s", r, r[len(r)-1], sum, 10, r[3])
		}
	}
}
