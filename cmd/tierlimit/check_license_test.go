package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/license"
)

// TestCheckLicenseBadInput: bad license input exits 2 naming the key
// (docs/design.md §13), and a byte unit on a packet policy names its key.
func TestCheckLicenseBadInput(t *testing.T) {
	const pre = "count: bytes\nmax: 10MB\nlicense:\n"
	for _, c := range []struct{ name, src, key string }{
		{"unknown zone", pre + "  per_day: 500GB\n  zone: Mars/Olympus\n", "license.zone"},
		{"per_day 0", pre + "  per_day: 0\n", "license.per_day"},
		{"warn_at 120%", pre + "  per_day: 500GB\n  warn_at: 120%\n", "license.warn_at"},
		{"burst window over a day", pre + "  per_day: 500GB\n  burst: {window: 25h, max: 3x}\n", "license.burst.window"},
		{"bad day_starts", pre + "  per_day: 500GB\n  day_starts: \"24:30\"\n", "license.day_starts"},
		{"byte unit on a packet policy", "max: 10MB\n", "max"},
		{"license on a packet policy", "max: 1000\nlicense: {per_day: 500GB}\n", "count: bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", c.src))
			if code != 2 || !strings.Contains(errs, c.key) {
				t.Errorf("exit %d, stderr %q; want 2 naming %s", code, errs, c.key)
			}
		})
	}
}

// TestCheckLicensePlan: check prints the license and the plan at 0.5, 1
// and 2 × the day's average rate; at 2× the paced day passes per_day.
func TestCheckLicensePlan(t *testing.T) {
	code, out, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml",
		"count: bytes\nmax: 100MB\nlicense: {per_day: 500GB, zone: America/Chicago, burst: {window: 5m, max: 3x}}\n"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"license: per_day=500GB day_starts=00:00 zone=America/Chicago", "burst cap: at most",
		"0.5 × avg", "1 × avg", "2 × avg", "100.0% of per_day", "UNPACED: SPENT AT"} {
		if !strings.Contains(out, want) {
			t.Errorf("check does not print %q:\n%s", want, out)
		}
	}
	if code, out, _ := runCmd(t, "check", "--config", writeFile(t, "p.yaml", "max: 1000\n")); code != 0 || strings.Contains(out, "license") {
		t.Errorf("without a license: exit %d, output names one", code)
	}
}

// TestStatusLicense: status --license reads the state file with no agent.
func TestStatusLicense(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "episode.json")
	now := time.Now()
	s := license.State{DayStart: now.Add(-time.Hour), DayEnd: now.Add(23 * time.Hour), Spent: 40e9, PerDay: 500e9,
		Zone: "UTC", Rate: 1e6, Target: 5e6, Max: 6e6, Window: "1s", Saved: now}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(license.StatePathFor(state), b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCmd(t, "status", "--license", "--state-file", state)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"spent", "40000000000 of 500000000000 bytes (8.0%)", "projected", "pacing line", "target 5000000 bytes"} {
		if !strings.Contains(out, want) {
			t.Errorf("status --license does not print %q:\n%s", want, out)
		}
	}
	if code, _, _ := runCmd(t, "status", "--license", "--shed"); code != 64 && code != 2 {
		t.Errorf("--license --shed: exit %d, want a usage error", code)
	}
}
