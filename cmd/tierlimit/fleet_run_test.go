package main

// Tests of run and status with a fleet: section (docs/design.md §12): the
// bad sections and an unreadable password_file refuse before anything is
// attached, a store that refuses the password starts run in fallback
// with an ERROR and fleet_auth_failed (issue 40: no node is left
// unprotected because of its store), a store out of reach starts run in
// fallback, and status --fleet lists the members from the store.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// fleetPolicy is a smooth policy with a fleet of name, store and max per
// 1 s window; extra is added to the fleet block (indented keys).
func fleetPolicy(name, store string, max int, extra string) string {
	return fmt.Sprintf(`shape: smooth
max: %d
tiers: [{at: 70%%, drop: 20%%}, {at: 80%%, drop: 50%%}, {at: 100%%, drop: 100%%}]
select: [{proto: udp, ports: [514]}]
fleet:
  name: %s
  store: %s
  max: %d
%s`, max, name, store, max, extra)
}

// TestRunFleetBadConfig: each bad fleet: section exits 2 with one line
// naming the key, before anything is attached (tlnone0 exists nowhere).
func TestRunFleetBadConfig(t *testing.T) {
	empty := writeFile(t, "empty.secret", "")
	base := "shape: smooth\nmax: 600\n"
	for _, c := range []struct {
		name, policy string
		want         []string
	}{
		{"missing name", base + "fleet:\n  store: redis://10.0.0.5:6379\n  max: 600\n", []string{"fleet.name"}},
		{"unknown scheme", base + "fleet:\n  name: f\n  store: memcached://10.0.0.5:6379\n  max: 600\n", []string{"fleet.store", "memcached"}},
		{"report not under ttl", base + "fleet:\n  name: f\n  store: redis://10.0.0.5:6379\n  max: 600\n  report: 3s\n  ttl: 3s\n", []string{"fleet.report", "fleet.ttl"}},
		{"ordinal shape", "shape: ordinal\nmax: 600\nfleet:\n  name: f\n  store: redis://10.0.0.5:6379\n  max: 600\n", []string{"shape", "ordinal", "smooth"}},
		{"max zero", base + "fleet:\n  name: f\n  store: redis://10.0.0.5:6379\n  max: 0\n", []string{"fleet.max"}},
		{"max too large", base + "fleet:\n  name: f\n  store: redis://10.0.0.5:6379\n  max: 99999999999999\n", []string{"fleet.max"}},
		{"password in the URL", base + "fleet:\n  name: f\n  store: redis://:hunter2@10.0.0.5:6379\n  max: 600\n", []string{"fleet.store"}},
		{"password_file missing", base + "fleet:\n  name: f\n  store: redis://10.0.0.5:6379\n  max: 600\n  password_file: /nonexistent/fleet.secret\n",
			[]string{"fleet.password_file", "/nonexistent/fleet.secret"}},
		{"password_file empty", base + "fleet:\n  name: f\n  store: redis://10.0.0.5:6379\n  max: 600\n  password_file: " + empty + "\n",
			[]string{"fleet.password_file", empty, "empty"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := writeFile(t, "policy.yaml", c.policy)
			var stderr bytes.Buffer
			err := run(context.Background(), []string{"run", "--iface", "tlnone0", "--no-pin", "--metrics-addr", "", "--config", cfg}, io.Discard, &stderr)
			if errors.Is(err, pin.ErrNoInterface) || errors.Is(err, agent.ErrNotRoot) {
				t.Fatalf("run got past the config check: %v", err)
			}
			if code := report(&stderr, err); code != 2 {
				t.Errorf("exit %d, want 2 (err %v)", code, err)
			}
			t.Logf("%s: %s", c.name, strings.TrimSpace(stderr.String()))
			oneLine(t, stderr.String(), c.want...)
			if strings.Contains(stderr.String(), "hunter2") {
				t.Errorf("the error shows the password: %q", stderr.String())
			}
		})
	}
}

// TestRunFleetStart runs `tierlimit run` with a fleet on a veth: a store
// that refuses the password starts it in fallback, limiting, with an
// ERROR naming password_file and tierlimit_fleet_auth_failed 1; a store
// out of reach starts it in fallback with a
// warning (tierlimit_fleet_fallback 1); the right password joins (the
// store lists the member, under --fleet-member); a reload with a new
// password_file after the store's password changed rejoins.
func TestRunFleetStart(t *testing.T) {
	testenv.Require(t)
	rd := testenv.StartRedis(t, testenv.RedisOptions{Password: "right-one"})
	p := runPair(t)
	wrong := writeFile(t, "wrong.secret", "wrong-one\n")

	t.Run("wrong password", func(t *testing.T) {
		cfg := writeFile(t, "policy.yaml", fleetPolicy("tlrun", rd.URL(), 600, "  password_file: "+wrong+"\n  report: 100ms\n  ttl: 1s\n"))
		r, addr := startCLI(t, p.Coll, "run", "--iface", p.CollIf, "--no-pin", "--metrics-addr", "127.0.0.1:0", "--config", cfg)
		if !strings.Contains(r.log.String(), "level=ERROR") || !strings.Contains(r.log.String(), "refuses the credentials") ||
			!strings.Contains(r.log.String(), "password_file") {
			t.Errorf("log lacks the ERROR on the refused credentials:\n%s", r.log)
		}
		if strings.Contains(r.log.String(), "wrong-one") {
			t.Errorf("the secret is in the log:\n%s", r.log)
		}
		for name, want := range map[string]float64{"tierlimit_fleet_auth_failed": 1, "tierlimit_fleet_fallback": 1} {
			if v := scrapeLabel(t, p.Coll, addr, name); v != want {
				t.Errorf("%s %v, want %v", name, v, want)
			}
		}
		if got := testenv.XDP(t, p.Coll, p.CollIf).Mode; got == "" {
			t.Errorf("with the store refusing, %s has no XDP: the node is unprotected", p.CollIf)
		}
		if err := r.stop(t); err != nil {
			t.Errorf("run: %v", err)
		}
	})

	t.Run("store out of reach", func(t *testing.T) {
		cfg := writeFile(t, "policy.yaml", fleetPolicy("tlrun", "redis://127.0.0.1:1", 600, "  report: 100ms\n  ttl: 1s\n"))
		r, addr := startCLI(t, p.Coll, "run", "--iface", p.CollIf, "--no-pin", "--metrics-addr", "127.0.0.1:0", "--config", cfg)
		if !strings.Contains(r.log.String(), "level=WARN") || !strings.Contains(r.log.String(), "starting in fallback") {
			t.Errorf("log lacks the fallback warning:\n%s", r.log)
		}
		if v := scrapeLabel(t, p.Coll, addr, "tierlimit_fleet_fallback"); v != 1 {
			t.Errorf("tierlimit_fleet_fallback %v, want 1", v)
		}
		if err := r.stop(t); err != nil {
			t.Errorf("run: %v", err)
		}
	})

	t.Run("joins and reloads the password", func(t *testing.T) {
		dir := t.TempDir()
		pw := filepath.Join(dir, "fleet.secret")
		if err := os.WriteFile(pw, []byte("right-one\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfgPath := filepath.Join(dir, "policy.yaml")
		write := func(report string) {
			t.Helper()
			if err := os.WriteFile(cfgPath, []byte(fleetPolicy("tlrun", rd.URL(), 600, "  report: "+report+"\n  ttl: 2s\n  password_file: "+pw+"\n")), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("100ms")
		r, addr := startCLI(t, p.Coll, "run", "--iface", p.CollIf, "--no-pin", "--metrics-addr", "127.0.0.1:0",
			"--config", cfgPath, "--fleet-member", "tl-member-a")
		if !strings.Contains(r.log.String(), "joined the fleet") {
			t.Errorf("log lacks the join:\n%s", r.log)
		}
		var out bytes.Buffer
		if err := run(context.Background(), []string{"status", "--fleet", "--config", cfgPath}, &out, io.Discard); err != nil {
			t.Fatalf("status --fleet: %v", err)
		}
		if !strings.Contains(out.String(), "tl-member-a") {
			t.Errorf("status --fleet does not list tl-member-a:\n%s", out.String())
		}
		// The store's password changes and its connections go: the member's
		// reports are refused, until the file follows and the config
		// changes, which reloads.
		errBefore := scrapeLabel(t, p.Coll, addr, `tierlimit_fleet_reports_total{result="error"}`)
		rd.CLI(t, 0, "CONFIG", "SET", "requirepass", "second-one")
		rd.CLI(t, 0, "--no-auth-warning", "-a", "second-one", "CLIENT", "KILL", "TYPE", "normal")
		deadline := time.Now().Add(10 * time.Second)
		for scrapeLabel(t, p.Coll, addr, `tierlimit_fleet_reports_total{result="error"}`) <= max(errBefore, 0) {
			if time.Now().After(deadline) {
				t.Fatalf("no report refused within 10s of the password change:\n%s", r.log)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := os.WriteFile(pw, []byte("second-one\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		write("200ms")
		okBefore := scrapeLabel(t, p.Coll, addr, `tierlimit_fleet_reports_total{result="ok"}`)
		deadline = time.Now().Add(10 * time.Second)
		for scrapeLabel(t, p.Coll, addr, `tierlimit_fleet_reports_total{result="ok"}`) < okBefore+3 {
			if time.Now().After(deadline) {
				t.Fatalf("no reports ok within 10s of the reload with the new password_file:\n%s", r.log)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if v := scrapeLabel(t, p.Coll, addr, "tierlimit_fleet_fallback"); v != 0 {
			t.Errorf("tierlimit_fleet_fallback %v after the reload, want 0", v)
		}
		if strings.Contains(r.log.String(), "second-one") || strings.Contains(r.log.String(), "right-one") {
			t.Errorf("the secret is in the log:\n%s", r.log)
		}
		if err := r.stop(t); err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

// scrapeLabel returns the value of the series written exactly as series
// (name{labels}) on /metrics, or -1 when it is absent.
func scrapeLabel(t *testing.T, ns *testenv.NS, addr, series string) float64 {
	t.Helper()
	status, body, err := testenv.Get(ns, "http://"+addr+"/metrics")
	if err != nil || status != 200 {
		t.Fatalf("/metrics: %d, %v", status, err)
	}
	return metricValue(string(body), series)
}

// metricValue is the value of series in a Prometheus text exposition, or
// -1 when it is absent.
func metricValue(body, series string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// TestStatusFleet: status --fleet lists the members a store holds, with
// their estimates and ages, as text and JSON, with no agent: two members
// reported through the controller's own script (a member's report is
// what run makes; here redis-cli writes what the controller's status
// script reads, so the test needs no BPF).
func TestStatusFleet(t *testing.T) {
	rd := testenv.StartRedis(t, testenv.RedisOptions{})
	cfg := writeFile(t, "policy.yaml", fleetPolicy("tlstatus", rd.URL(), 600, "  ttl: 3s\n"))
	var out bytes.Buffer
	if err := run(context.Background(), []string{"status", "--fleet", "--config", cfg}, &out, io.Discard); err != nil {
		t.Fatalf("status --fleet: %v", err)
	}
	if !strings.Contains(out.String(), "no members") {
		t.Errorf("an empty fleet:\n%s", out.String())
	}
	reportAs(t, rd, "tlstatus", "alpha", 420)
	reportAs(t, rd, "tlstatus", "beta", 180)
	out.Reset()
	if err := run(context.Background(), []string{"status", "--fleet", "--config", cfg}, &out, io.Discard); err != nil {
		t.Fatalf("status --fleet: %v", err)
	}
	t.Logf("status --fleet:\n%s", out.String())
	for _, want := range []string{"fleet tlstatus", "2 members", "R̂_fleet 600", "alpha", "420", "beta", "180", "ago"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status --fleet lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Index(out.String(), "alpha") > strings.Index(out.String(), "beta") {
		t.Errorf("not busiest first:\n%s", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"status", "--fleet", "--json", "--config", cfg}, &out, io.Discard); err != nil {
		t.Fatalf("status --fleet --json: %v", err)
	}
	var js fleetJSON
	if err := json.Unmarshal(out.Bytes(), &js); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if js.Name != "tlstatus" || js.Offered != 600 || len(js.Members) != 2 || js.Members[0].Name != "alpha" ||
		js.Members[0].Estimate != 420 || js.Members[0].EstimateIn != 420 || js.Members[0].AgeNs < 0 || js.Members[0].AgeNs > int64(3*time.Second) || js.Members[0].Stale {
		t.Errorf("status --fleet --json: %+v", js)
	}
	// No agent, a store out of reach: exit 1, one line naming the store.
	bad := writeFile(t, "bad.yaml", fleetPolicy("tlstatus", "redis://127.0.0.1:1", 600, ""))
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"status", "--fleet", "--config", bad}, io.Discard, &stderr)
	if code := report(&stderr, err); code != 1 {
		t.Errorf("store out of reach: exit %d, want 1", code)
	}
	oneLine(t, stderr.String(), "redis://127.0.0.1:1")
	// --fleet without --config, or with a policy without fleet: exit 2.
	for _, args := range [][]string{{"status", "--fleet"}, {"status", "--fleet", "--config", writeFile(t, "p.yaml", runPolicy)}} {
		stderr.Reset()
		err := run(context.Background(), args, io.Discard, &stderr)
		if code := report(&stderr, err); code != 2 {
			t.Errorf("%q: exit %d, want 2: %s", args, code, stderr.String())
		}
	}
}

// fixedEstimate stands where the program stands for a member that status
// lists: it reports a fixed estimate (the controller's seam to *bpf.Limiter).
type fixedEstimate uint64

func (f fixedEstimate) FleetEstimate() (uint64, uint64, error) { return uint64(f), uint64(f), nil }
func (fixedEstimate) SetFleetOthers(uint64, uint64) error      { return nil }
func (fixedEstimate) EnterFallback(int) error                  { return nil }
func (fixedEstimate) LeaveFallback() error                     { return nil }

// reportAs joins the fleet name in rd as member with estimate est, through
// the fleet controller (its report script), until the test ends.
func reportAs(t *testing.T, rd *testenv.Redis, name, member string, est uint64) {
	t.Helper()
	c, err := fleet.Start(fleet.Config{Name: name, Member: member, Store: rd.URL(), Max: 600,
		Report: 100 * time.Millisecond, TTL: 3 * time.Second}, fixedEstimate(est), fixedEstimate(est), nil)
	if err != nil {
		t.Fatalf("member %s: %v", member, err)
	}
	t.Cleanup(func() { c.Close() })
}
