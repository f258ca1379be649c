package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestStatusFleetFlags: status --fleet shows each instance (two agents
// under one name both listed, flagged name-conflict, and said once above
// the table) and the settings each wrote (a member whose fleet.max
// differs from the most members' flagged settings-differ), as text and
// JSON. The members report through the controller with the settings the
// agent gives it (the policy's window and table digest).
func TestStatusFleetFlags(t *testing.T) {
	rd := testenv.StartRedis(t, testenv.RedisOptions{})
	text := fleetPolicy("tlflags", rd.URL(), 600, "  ttl: 3s\n")
	cfgPath := writeFile(t, "policy.yaml", text)
	p, err := tiers.LoadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	start := func(member string, est uint64, fleetMax uint64) {
		cfg := agent.FleetConfig(p.Fleet, member)
		cfg.Window, cfg.Digest = p.Window, p.FleetDigest()
		cfg.Max = fleetMax
		c, err := fleet.Start(cfg, fixedEstimate(est), fixedEstimate(est), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	start("alpha", 300, 600)
	start("alpha", 200, 600)
	start("beta", 100, 600)
	start("gamma", 50, 900)

	var out bytes.Buffer
	if err := run(context.Background(), []string{"status", "--fleet", "--config", cfgPath}, &out, io.Discard); err != nil {
		t.Fatalf("status --fleet: %v", err)
	}
	t.Logf("status --fleet:\n%s", out.String())
	s := out.String()
	for _, want := range []string{"4 members", "R̂_fleet 650", "CONFLICT: more than one agent reports under the name alpha",
		"DIFFERS: gamma/", "INSTANCE", p.FleetDigest(), "settings-differ"} {
		if !strings.Contains(s, want) {
			t.Errorf("status --fleet lacks %q", want)
		}
	}
	if n := strings.Count(s, "name-conflict"); n != 2 {
		t.Errorf("%d rows flagged name-conflict; want the two alpha rows", n)
	}
	out.Reset()
	if err := run(context.Background(), []string{"status", "--fleet", "--json", "--config", cfgPath}, &out, io.Discard); err != nil {
		t.Fatalf("status --fleet --json: %v", err)
	}
	var js fleetJSON
	if err := json.Unmarshal(out.Bytes(), &js); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if len(js.Members) != 4 {
		t.Fatalf("%d members in JSON; want 4", len(js.Members))
	}
	for _, m := range js.Members {
		if m.Conflict != (m.Name == "alpha") || m.Differs != (m.Name == "gamma") || len(m.Instance) != 16 ||
			m.WindowNs != int64(time.Second) || m.MemberTTL != int64(3*time.Second) || m.Digest != p.FleetDigest() {
			t.Errorf("member %+v", m)
		}
	}
}
