package fleet_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestFleetTwoUnderOneName: two agents under one member name (cloned
// hosts) are two instances, both counted: each sees the other's estimate
// and the third member's, the fleet counts three, and each says so once
// as an ERROR, in fleet_member_conflicts and in Status; when one leaves,
// the name is the other's alone again.
func TestFleetTwoUnderOneName(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	d1 := join(t, testConfig(r.URL(), "dup", "clone"), 300)
	d2 := join(t, testConfig(r.URL(), "dup", "clone"), 200)
	x := join(t, testConfig(r.URL(), "dup", "x"), 100)
	shares(t, 20, d1, d2, x)
	for _, m := range []*member{d1, d2} {
		if !waitFor(20, func() bool { return metric(t, m.c, "tierlimit_fleet_member_conflicts") == 1 }) {
			t.Errorf("clone: fleet_member_conflicts %v; want 1", metric(t, m.c, "tierlimit_fleet_member_conflicts"))
		}
	}
	time.Sleep(5 * testReport) // many reports find the other: one ERROR each
	for _, m := range []*member{d1, d2} {
		if n := strings.Count(m.log.String(), "level=ERROR msg=\"fleet: another agent reports under this member name"); n != 1 {
			t.Errorf("clone: %d ERROR lines about the name; want 1:\n%s", n, m.log)
		}
	}
	if got := metric(t, x.c, "tierlimit_fleet_member_conflicts"); got != 0 {
		t.Errorf("x: fleet_member_conflicts %v; want 0", got)
	}
	st, err := fleet.Status(context.Background(), testConfig(r.URL(), "dup", ""))
	if err != nil || len(st) != 3 {
		t.Fatalf("Status: %v, %+v; want 3 entries", err, st)
	}
	if st[0].Name != "clone" || st[1].Name != "clone" || !st[0].Conflict || !st[1].Conflict || st[2].Conflict ||
		st[0].Instance == st[1].Instance || len(st[0].Instance) != 16 {
		t.Errorf("Status %+v; want the two clones flagged, with their own instances", st)
	}

	if err := d2.c.Close(); err != nil {
		t.Fatal(err)
	}
	shares(t, 20, d1, x)
	if !waitFor(20, func() bool { return metric(t, d1.c, "tierlimit_fleet_member_conflicts") == 0 }) {
		t.Errorf("fleet_member_conflicts %v after the other clone left; want 0", metric(t, d1.c, "tierlimit_fleet_member_conflicts"))
	}
	if !strings.Contains(d1.log.String(), "this member name is this agent's alone again") {
		t.Errorf("no line says the conflict cleared:\n%s", d1.log)
	}
}

// TestFleetRestartReplaces: an agent that dies (no leave) and starts again
// with its instance file replaces its earlier entry at its first report:
// the others never count the two, long before the dead entry's ttl, and
// no conflict is said.
func TestFleetRestartReplaces(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	file := filepath.Join(t.TempDir(), "state", "fleet-instance")
	cfg := testConfig(r.URL(), "re", "host")
	cfg.TTL = 20 * time.Second // an entry left behind would be counted for 20 s
	cfg.InstanceFile = file
	other := testConfig(r.URL(), "re", "other")
	other.TTL = cfg.TTL
	o := join(t, other, 10)
	first := join(t, cfg, 500)
	shares(t, 20, o, first)
	b, err := os.ReadFile(file)
	if err != nil || len(strings.TrimSpace(string(b))) != 16 {
		t.Fatalf("instance file %q, %v; want 16 hex digits", b, err)
	}
	first.c.Halt() // dies: its entry stays for ttl

	second := join(t, cfg, 70)
	_, n0 := o.k.calls()
	if !waitFor(20, func() bool { return o.k.othersNow() == 70 }) {
		t.Fatalf("other: others %d; want 70, the restarted agent's alone", o.k.othersNow())
	}
	if _, n := o.k.calls(); n-n0 > 2 {
		t.Errorf("other took %d reports to drop the earlier instance; want at most 2", n-n0)
	}
	if got := metric(t, second.c, "tierlimit_fleet_members"); got != 2 {
		t.Errorf("fleet_members %v; want 2", got)
	}
	if got := metric(t, second.c, "tierlimit_fleet_member_conflicts"); got != 0 {
		t.Errorf("fleet_member_conflicts %v after a restart; want 0", got)
	}
	if strings.Contains(second.log.String(), "level=ERROR") {
		t.Errorf("the restarted agent logged an error:\n%s", second.log)
	}
	b2, _ := os.ReadFile(file)
	if string(b2) == string(b) {
		t.Errorf("the instance file still holds the earlier instance %q", b)
	}
}

// TestFleetEntryOwnTTL: an entry ages out on the ttl written with it, not
// the reporter's: a member with a short ttl never drops a slower one that
// reports within its own, longer ttl; a halted slow member is counted
// until its ttl has passed, then dropped.
func TestFleetEntryOwnTTL(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	fastCfg := testConfig(r.URL(), "ttl", "fast")
	fastCfg.TTL = 300 * time.Millisecond
	slowCfg := testConfig(r.URL(), "ttl", "slow")
	slowCfg.Report, slowCfg.TTL = 600*time.Millisecond, 2*time.Second
	fast := join(t, fastCfg, 10)
	slow := join(t, slowCfg, 400)
	if !waitFor(20, func() bool { return fast.k.othersNow() == 400 }) {
		t.Fatalf("fast: others %d; want slow's 400", fast.k.othersNow())
	}
	_, n0 := fast.k.calls()
	time.Sleep(2 * slowCfg.Report)
	fast.k.mu.Lock()
	seen := append([]uint64(nil), fast.k.history[n0:]...)
	fast.k.mu.Unlock()
	for i, v := range seen {
		if v != 400 {
			t.Fatalf("fast's report %d after the slow member joined saw others %d; want 400 at every report: %v", i, v, seen)
		}
	}
	slow.c.Halt()
	halted := time.Now()
	time.Sleep(time.Second)
	if got := fast.k.othersNow(); got != 400 {
		t.Errorf("fast dropped the slow member %v after it stopped, within its ttl of %v: others %d", time.Since(halted), slowCfg.TTL, got)
	}
	if !waitFor(40, func() bool { return fast.k.othersNow() == 0 }) {
		t.Fatalf("fast still counts the slow member %v after it stopped", time.Since(halted))
	}
	if d := time.Since(halted); d < slowCfg.TTL-slowCfg.Report {
		t.Errorf("the slow member was dropped %v after its last report; want its ttl %v", d, slowCfg.TTL)
	}
}

// TestFleetSettingsDiffer: a member whose fleet.max, ttl, window or table
// digest differs from the most members' is flagged (fleet_settings_differ
// 1, one WARN, Status), every member counts the groups, and a reload that
// brings it in line clears the flag.
func TestFleetSettingsDiffer(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	cfg := func(name string) fleet.Config {
		c := testConfig(r.URL(), "agree", name)
		c.Window, c.Digest = time.Second, "00112233aabbccdd"
		return c
	}
	a := join(t, cfg("a"), 10)
	b := join(t, cfg("b"), 20)
	odd := cfg("odd")
	odd.Digest = "ffffffffffffffff"
	c := join(t, odd, 30)
	shares(t, 20, a, b, c)
	if !waitFor(20, func() bool { return metric(t, c.c, "tierlimit_fleet_settings_differ") == 1 }) {
		t.Fatalf("odd: fleet_settings_differ %v; want 1", metric(t, c.c, "tierlimit_fleet_settings_differ"))
	}
	for _, m := range []*member{a, b, c} {
		if !waitFor(20, func() bool { return metric(t, m.c, "tierlimit_fleet_settings_groups") == 2 }) {
			t.Errorf("%s: fleet_settings_groups %v; want 2", m.name, metric(t, m.c, "tierlimit_fleet_settings_groups"))
		}
	}
	for _, m := range []*member{a, b} {
		if got := metric(t, m.c, "tierlimit_fleet_settings_differ"); got != 0 {
			t.Errorf("%s: fleet_settings_differ %v; want 0 (with the most members)", m.name, got)
		}
	}
	time.Sleep(5 * testReport)
	if n := strings.Count(c.log.String(), "level=WARN msg=\"fleet: this member's window, fleet.max, ttl or tier table differs"); n != 1 {
		t.Errorf("odd: %d WARN lines about its settings; want 1:\n%s", n, c.log)
	}
	st, err := fleet.Status(context.Background(), cfg(""))
	if err != nil || len(st) != 3 {
		t.Fatalf("Status: %v, %+v", err, st)
	}
	for _, m := range st {
		if m.Differs != (m.Name == "odd") || m.Window != time.Second || m.Max != 1000 || m.TTL != testTTL {
			t.Errorf("Status %+v: want only odd flagged, window 1s, max 1000, ttl %v", m, testTTL)
		}
	}
	// Each other setting alone flags too.
	for _, edit := range []func(*fleet.Config){
		func(c *fleet.Config) { c.Max = 999 },
		func(c *fleet.Config) { c.TTL = 2 * time.Second },
		func(c *fleet.Config) { c.Window = 2 * time.Second },
	} {
		if err := c.c.Reload(cfg("odd")); err != nil {
			t.Fatal(err)
		}
		if !waitFor(20, func() bool { return metric(t, c.c, "tierlimit_fleet_settings_differ") == 0 }) {
			t.Fatalf("odd in line: still flagged")
		}
		bad := cfg("odd")
		edit(&bad)
		if err := c.c.Reload(bad); err != nil {
			t.Fatal(err)
		}
		if !waitFor(20, func() bool { return metric(t, c.c, "tierlimit_fleet_settings_differ") == 1 }) {
			t.Errorf("odd with %+v: not flagged", bad)
		}
	}
	if err := c.c.Reload(cfg("odd")); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*member{a, b, c} {
		if !waitFor(20, func() bool {
			return metric(t, m.c, "tierlimit_fleet_settings_groups") == 1 && metric(t, m.c, "tierlimit_fleet_settings_differ") == 0
		}) {
			t.Errorf("%s: groups %v, differ %v after the reload; want 1, 0", m.name,
				metric(t, m.c, "tierlimit_fleet_settings_groups"), metric(t, m.c, "tierlimit_fleet_settings_differ"))
		}
	}
	if !strings.Contains(c.log.String(), "settings agree with the fleet's again") {
		t.Errorf("no line says the settings agree again:\n%s", c.log)
	}
}
