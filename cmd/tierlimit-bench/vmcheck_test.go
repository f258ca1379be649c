package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// verdicts builds a scrape with per-tier pass/drop counts.
func verdicts(pd ...[2]float64) map[string]float64 {
	m := map[string]float64{}
	for k, v := range pd {
		m[fmt.Sprintf(`tierlimit_selected_packets_total{tier="%d",verdict="pass"}`, k)] = v[0]
		m[fmt.Sprintf(`tierlimit_selected_packets_total{tier="%d",verdict="drop"}`, k)] = v[1]
	}
	return m
}

func TestCheckWindow(t *testing.T) {
	tab, err := tiers.Compile(benchPolicy(1000, 2*time.Second), 0)
	if err != nil {
		t.Fatal(err)
	}
	// One window of 1248 under max 1000: tiers of 699, 100, 200, 249 packets.
	one := verdicts([2]float64{699, 0}, [2]float64{80, 20}, [2]float64{100, 100}, [2]float64{0, 249})
	for _, tc := range []struct {
		name  string
		m     map[string]float64
		lines int
		want  string // "" = passes
	}{
		{"one window", one, 879, ""},
		{"rsyslog lost some", one, 870, "metrics passed 879 but rsyslog got 870"},
		{"far from the model", verdicts([2]float64{699, 0}, [2]float64{100, 0}, [2]float64{200, 0}, [2]float64{0, 249}), 999, "the model expects"},
		{"two windows", verdicts([2]float64{1398, 0}, [2]float64{80, 20}, [2]float64{100, 100}, [2]float64{0, 0}), 1578, "spanned two windows"},
		{"not above max", verdicts([2]float64{699, 0}, [2]float64{80, 20}, [2]float64{100, 100}), 879, "not above max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := windowCheck{log: filepath.Join(dir, "log"), state: filepath.Join(dir, "state"), tab: tab, max: 1000, sigmas: 5}
			if err := c.save(windowState{Metrics: map[string]float64{}}); err != nil {
				t.Fatal(err)
			}
			err := c.checkWindow(tc.lines, tc.m, io.Discard)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkWindow = %v, want %q", err, tc.want)
			}
			s, err := readState(c.state)
			if err != nil {
				t.Fatal(err)
			}
			if s.Window != 1 || (s.Failed == 1) != (tc.want != "") {
				t.Fatalf("state after the check %+v", s)
			}
			if err := c.checkTotal(tc.lines, s.Pass, io.Discard); (err == nil) != (tc.want == "") {
				t.Fatalf("checkTotal = %v after a window with want %q", err, tc.want)
			}
		})
	}
}

func TestCountLines(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if n, err := countLines(p); n != 0 || err != nil {
		t.Fatalf("countLines of a missing file = %d, %v", n, err)
	}
	if err := os.WriteFile(p, []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := countLines(p); n != 3 || err != nil {
		t.Fatalf("countLines = %d, %v, want 3", n, err)
	}
}
