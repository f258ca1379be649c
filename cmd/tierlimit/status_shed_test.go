package main

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/record"
)

// TestStatusShed prints the episode an agent left in its state file, in
// text and JSON, with no agent and no pinned state.
func TestStatusShed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "episode.json")
	code, out, _ := runCmd(t, "status", "--shed", "--state-file", path)
	if code != 0 || !strings.Contains(out, "no shedding episode recorded") {
		t.Errorf("no file: exit %d, %q", code, out)
	}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ep := record.Episode{ID: 7, Start: start, End: start.Add(90 * time.Second), Interfaces: []string{"eth1"}, Mode: "enforce",
		Max: 40000, OfferedRate: 120000, PeakRate: 150000, Shed: 9000000,
		ByTier: map[string]uint64{"3": 8000000, "2": 500000}, ByReason: map[string]uint64{"tier": 8500000, "over_budget": 500000},
		Samples: 9000, Top: []record.GroupShare{{Group: netip.MustParsePrefix("10.1.2.0/24"), Samples: 6000, Share: 6000.0 / 9000},
			{Group: netip.MustParsePrefix("2001:db8::/64"), Samples: 3000, Share: 3000.0 / 9000}}}
	est := 0.125
	ep.Top[0].PassEst = &est
	ep.Weights = &record.Weights{From: start, To: start.Add(10 * time.Second), All: record.Fraction{Passed: 250, Offered: 1000},
		Classes:    map[string]record.Fraction{"protected": {Passed: 40, Offered: 40}, "normal": {Passed: 210, Offered: 700}, "shed_first": {}},
		OverBudget: record.Fraction{Passed: 0, Offered: 260}}
	b, _ := json.Marshal(ep)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCmd(t, "status", "--shed", "--state-file", path)
	for _, want := range []string{"episode     7 (closed)", "duration    1m30s", "shed        9000000 packets",
		"by tier     2: 500000, 3: 8000000", "by reason   over_budget: 500000, tier: 8500000",
		"top source groups by sampled sheds (9000 samples)", "10.1.2.0/24    6000     66.7%  0.125", "2001:db8::/64  3000     33.3%  -",
		"passed 250 of 1000 (pass_frac 0.25, weight 4); normal 0.3; protected 1; over budget 0"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("exit %d, output lacks %q:\n%s", code, want, out)
		}
	}
	// Under a fleet (issue 43 B78): the max the limiter sheds against,
	// fleet.max, named so.
	fl := ep
	fl.Max, fl.MaxOf = 1000, "fleet.max"
	fpath := filepath.Join(t.TempDir(), "episode.json")
	if b, _ := json.Marshal(fl); os.WriteFile(fpath, b, 0o600) != nil {
		t.Fatal("write")
	}
	if code, out, _ := runCmd(t, "status", "--shed", "--state-file", fpath); code != 0 || !strings.Contains(out, "(max 1000 per window: fleet.max)") {
		t.Errorf("fleet episode: exit %d, output lacks the fleet's max:\n%s", code, out)
	}
	code, out, _ = runCmd(t, "status", "--shed", "--json", "--state-file", path)
	var got record.Episode
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.ID != 7 || len(got.Top) != 2 || got.Top[0].Group != ep.Top[0].Group {
		t.Errorf("--json: exit %d, %v: %s", code, err, out)
	}
}

// TestCheckRecord: check states the shed record and where reports go.
func TestCheckRecord(t *testing.T) {
	cfg := writeFile(t, "p.yaml", "max: 1000\nrecord: {samples: 50/s, dir: /var/lib/tierlimit/shed, max_bytes: 64MiB}\nevents: {syslog: 'tcp://[2001:db8::5]:601'}\n")
	code, out, _ := runCmd(t, "check", "--config", cfg)
	for _, want := range []string{
		"shed record: at most 50 samples/s of shed packets, 256 bytes each, as pcapng in /var/lib/tierlimit/shed within 67108864 bytes",
		"episode reports: tcp://[2001:db8::5]:601 (RFC 5424) and the agent's log; a summary every 10s",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("exit %d, check lacks %q:\n%s", code, want, out)
		}
	}
}

// TestStatusShedPinPath (issue 43 B76): without --state-file, status
// --shed reads the state file of --pin-path's agent, which run derives
// from the pin path the same way: two agents with their own pin paths
// keep two files.
func TestStatusShedPinPath(t *testing.T) {
	t.Setenv("STATE_DIRECTORY", t.TempDir())
	other := "/sys/fs/bpf/tierlimit-b"
	if agent.DefaultStatePath(other) == agent.DefaultStatePath(agent.DefaultPinPath) {
		t.Fatalf("pin paths %s and %s share %s", other, agent.DefaultPinPath, agent.DefaultStatePath(other))
	}
	b, _ := json.Marshal(record.Episode{ID: 3, Start: time.Now(), Interfaces: []string{"eth1"}, Mode: "enforce", Max: 5})
	if err := os.WriteFile(agent.DefaultStatePath(other), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runCmd(t, "status", "--shed", "--pin-path", other); code != 0 || !strings.Contains(out, "episode     3 (closed)") {
		t.Errorf("status --shed --pin-path %s: exit %d:\n%s", other, code, out)
	}
	if code, out, _ := runCmd(t, "status", "--shed"); code != 0 || !strings.Contains(out, "no shedding episode recorded") {
		t.Errorf("status --shed of the default pin path: exit %d:\n%s", code, out)
	}
}
