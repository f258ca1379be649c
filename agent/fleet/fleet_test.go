package fleet_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// shares checks that each member's others' sums are the sums of the other
// members' estimates, in budget and in all, and that each counts len(ms)
// members, within n reports.
func shares(t *testing.T, n int, ms ...*member) {
	t.Helper()
	var totalIn, total uint64
	for _, m := range ms {
		m.k.mu.Lock()
		totalIn, total = totalIn+m.k.estIn, total+m.k.est
		m.k.mu.Unlock()
	}
	for _, m := range ms {
		m.k.mu.Lock()
		wantIn, want := totalIn-m.k.estIn, total-m.k.est
		m.k.mu.Unlock()
		ok := waitFor(n, func() bool {
			in, tot := m.k.othersPair()
			return in == wantIn && tot == want && metric(t, m.c, "tierlimit_fleet_members") == float64(len(ms))
		})
		if !ok {
			in, tot := m.k.othersPair()
			t.Errorf("member %s: others %d in budget, %d in all, members %v; want %d, %d and %d", m.name, in, tot,
				metric(t, m.c, "tierlimit_fleet_members"), wantIn, want, len(ms))
		}
	}
}

// TestFleetSharing: three members carrying 60, 30 and 10 % of the load
// (a with 200 of its 600 over budget) each see the sums of the other two,
// in budget and in all, and count three members.
func TestFleetSharing(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	sharing(t, r.URL(), "")
}

func sharing(t *testing.T, store, caFile string) {
	t.Helper()
	var ms []*member
	for i, est := range [][2]uint64{{400, 600}, {300, 300}, {100, 100}} {
		cfg := testConfig(store, "eu", string(rune('a'+i)))
		cfg.CAFile = caFile
		ms = append(ms, joinPair(t, cfg, est[0], est[1]))
	}
	shares(t, 20, ms...)
	for _, m := range ms {
		if got := metric(t, m.c, "tierlimit_fleet_offered"); got != 1000 {
			t.Errorf("member %s: fleet_offered %v, want 1000", m.name, got)
		}
		if got := metric(t, m.c, "tierlimit_fleet_store_up"); got != 1 {
			t.Errorf("member %s: fleet_store_up %v, want 1", m.name, got)
		}
	}
	// The load moves: the others follow within a report or two.
	ms[2].k.set(500)
	shares(t, 20, ms...)
	// Status lists the three, busiest first, heard from within ttl.
	got, err := ms[0].c.Members(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Name != "a" || got[0].Estimate != 600 || got[0].In != 400 || got[1].Name != "c" || got[1].Estimate != 500 || got[1].In != 500 {
		t.Errorf("members %+v; want a 600 (400 in budget), c 500, b 300", got)
	}
	// a's traffic over budget ends: the others' in-budget sums follow.
	ms[0].k.set(600)
	shares(t, 20, ms...)
	for _, m := range got {
		if m.Age < 0 || m.Age > testTTL || time.Since(m.Heard) > time.Minute {
			t.Errorf("member %s heard %v, age %v: want within ttl", m.Name, m.Heard, m.Age)
		}
	}
	cfg := testConfig(store, "eu", "")
	cfg.CAFile = caFile
	st, err := fleet.Status(context.Background(), cfg)
	if err != nil || len(st) != 3 {
		t.Errorf("Status: %v, %+v; want 3 members", err, st)
	}
	for _, m := range ms {
		if in, entered, _, bad := m.a.state(); in || len(entered) > 0 || bad != "" {
			t.Errorf("member %s: fallback entered %v (%s)", m.name, entered, bad)
		}
	}
}

// TestFleetJoinLeave: a member that closes leaves at once; one that stops
// reporting ages out within ttl; one that joins is counted within two
// reports.
func TestFleetJoinLeave(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	a := join(t, testConfig(r.URL(), "jl", "a"), 100)
	b := join(t, testConfig(r.URL(), "jl", "b"), 200)
	c := join(t, testConfig(r.URL(), "jl", "c"), 400)
	shares(t, 20, a, b, c)

	// Close (the agent's SIGTERM path) deletes c's entry: a and b stop
	// counting it at their next report, long before ttl.
	if err := c.c.Close(); err != nil {
		t.Fatalf("close c: %v", err)
	}
	_, aSet := a.k.calls()
	if !waitFor(20, func() bool { return a.k.othersNow() == 200 }) {
		t.Fatalf("a still counts c after it closed: others %d", a.k.othersNow())
	}
	if _, n := a.k.calls(); n-aSet > 2 {
		t.Errorf("a took %d reports to drop a member that left; want at most 2", n-aSet)
	}

	// b stops reporting without leaving (a crash): a drops it within ttl.
	b.c.Halt()
	_, aSet = a.k.calls()
	if !waitFor(40, func() bool { return a.k.othersNow() == 0 }) {
		t.Fatalf("a still counts b %v after it stopped: others %d", 40*testReport, a.k.othersNow())
	}
	if _, n := a.k.calls(); n-aSet > int(testTTL/testReport)+2 {
		t.Errorf("a took %d reports to drop a silent member; want at most ttl/report + 2 = %d", n-aSet, int(testTTL/testReport)+2)
	}
	if got := metric(t, a.c, "tierlimit_fleet_members"); got != 1 {
		t.Errorf("fleet_members %v, want 1", got)
	}

	// d joins: Start returns after its first report, and a counts it
	// within two of its own.
	_, aSet = a.k.calls()
	d := join(t, testConfig(r.URL(), "jl", "d"), 50)
	if !waitFor(20, func() bool { return a.k.othersNow() == 50 }) {
		t.Fatalf("a does not count d: others %d", a.k.othersNow())
	}
	if _, n := a.k.calls(); n-aSet > 2 {
		t.Errorf("a took %d reports to count a new member; want at most 2", n-aSet)
	}
	shares(t, 20, a, d)
}

// TestFleetStoreKilled: with the store gone, each member keeps its view
// for ttl, then enters fallback once (logged once, fleet_fallback 1) with
// the members it last saw; when the store is back, it rejoins within two
// reports.
func TestFleetStoreKilled(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	a := join(t, testConfig(r.URL(), "k", "a"), 100)
	b := join(t, testConfig(r.URL(), "k", "b"), 300)
	shares(t, 20, a, b)

	r.Kill(t)
	aEst, _ := a.k.calls()
	for _, m := range []*member{a, b} {
		if !waitFor(40, func() bool { in, _, _, _ := m.a.state(); return in }) {
			t.Fatalf("member %s not in fallback %v after the store died", m.name, 40*testReport)
		}
	}
	if n, _ := a.k.calls(); n-aEst > int(testTTL/testReport)+2 {
		t.Errorf("a entered fallback after %d reports; want within ttl/report + 2 = %d", n-aEst, int(testTTL/testReport)+2)
	}
	// Reports go on while in fallback; the view is not touched again.
	time.Sleep(5 * testReport)
	for _, m := range []*member{a, b} {
		_, entered, _, bad := m.a.state()
		if len(entered) != 1 || entered[0] != 2 || bad != "" {
			t.Errorf("member %s: EnterFallback calls %v (%s); want one, with 2 members", m.name, entered, bad)
		}
		if got := m.k.othersNow(); got != 0 {
			t.Errorf("member %s: others %d in fallback; want 0", m.name, got)
		}
		if n := strings.Count(m.log.String(), "in fallback"); n != 1 {
			t.Errorf("member %s: %d log lines say fallback; want 1:\n%s", m.name, n, m.log)
		}
		if got := metric(t, m.c, "tierlimit_fleet_fallback"); got != 1 {
			t.Errorf("member %s: fleet_fallback %v; want 1", m.name, got)
		}
		if got := metric(t, m.c, "tierlimit_fleet_store_up"); got != 0 {
			t.Errorf("member %s: fleet_store_up %v; want 0", m.name, got)
		}
		if got := metric(t, m.c, "tierlimit_fleet_reports_total", `result="error"`); got < 5 {
			t.Errorf("member %s: %v reports counted error; want >= 5", m.name, got)
		}
	}

	r.Restart(t)
	aEst, _ = a.k.calls()
	for _, m := range []*member{a, b} {
		if !waitFor(20, func() bool { in, _, _, _ := m.a.state(); return !in }) {
			t.Fatalf("member %s did not rejoin after the store came back", m.name)
		}
	}
	// go-redis probes a refusing address once a second (backoff.go).
	if n, _ := a.k.calls(); n-aEst > int(time.Second/testReport)+2 {
		t.Errorf("a rejoined after %d reports; want at most 1 s / report + 2 = %d", n-aEst, int(time.Second/testReport)+2)
	}
	shares(t, 20, a, b)
	for _, m := range []*member{a, b} {
		if _, _, left, bad := m.a.state(); left != 1 || bad != "" {
			t.Errorf("member %s: LeaveFallback calls %d (%s); want 1", m.name, left, bad)
		}
		if n := strings.Count(m.log.String(), "rejoined"); n != 1 {
			t.Errorf("member %s: %d log lines say rejoined; want 1", m.name, n)
		}
		if got := metric(t, m.c, "tierlimit_fleet_fallback"); got != 0 {
			t.Errorf("member %s: fleet_fallback %v after rejoining; want 0", m.name, got)
		}
	}
}

// TestFleetStoreStopped: a store that hangs (SIGSTOP) makes reports slow,
// never the loop: the program is still read every report, and after ttl
// the member is in fallback; SIGCONT brings it back.
func TestFleetStoreStopped(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	a := join(t, testConfig(r.URL(), "s", "a"), 100)
	b := join(t, testConfig(r.URL(), "s", "b"), 300)
	shares(t, 20, a, b)

	r.Signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { r.Signal(t, syscall.SIGCONT) })
	est0, _ := a.k.calls()
	start := time.Now()
	time.Sleep(2 * testTTL)
	est1, _ := a.k.calls()
	elapsed := time.Since(start)
	// A report waits at most report, so the loop runs at least every
	// 2 × report: half the ticks of the period, less one for the edges.
	if min := int(elapsed/(2*testReport)) - 1; est1-est0 < min {
		t.Errorf("the loop read the estimate %d times in %v of a stopped store; want >= %d", est1-est0, elapsed, min)
	}
	if got := metric(t, a.c, "tierlimit_fleet_reports_total", `result="slow"`); got < 5 {
		t.Errorf("%v reports counted slow; want >= 5", got)
	}
	if in, _, _, _ := a.a.state(); !in {
		t.Errorf("a not in fallback after %v of a stopped store", elapsed)
	}

	r.Signal(t, syscall.SIGCONT)
	if !waitFor(30, func() bool { in, _, _, _ := a.a.state(); return !in }) {
		t.Fatalf("a did not rejoin after SIGCONT")
	}
	shares(t, 20, a, b)
}

// TestFleetWrongPassword: a store that refuses the password at start
// starts the member in fallback (with no members seen), with one ERROR
// and fleet_auth_failed 1, and never shows the secret (issue 40: a node is
// never left unprotected because of its store); the right password joins.
func TestFleetWrongPassword(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: "right-horse"})
	dir := t.TempDir()
	wrong := filepath.Join(dir, "wrong")
	right := filepath.Join(dir, "right")
	os.WriteFile(wrong, []byte("battery-staple\n"), 0o600)
	os.WriteFile(right, []byte("right-horse\n"), 0o600)

	for _, pf := range []string{wrong, ""} {
		cfg := testConfig(r.URL(), "pw", "a")
		cfg.PasswordFile = pf
		m := join(t, cfg, 10)
		if in, entered, _, _ := m.a.state(); !in || len(entered) != 1 || entered[0] != 0 {
			t.Errorf("password_file %q: fallback %v, EnterFallback %v; want in fallback with 0 members seen", pf, in, entered)
		}
		if got := metric(t, m.c, "tierlimit_fleet_auth_failed"); got != 1 {
			t.Errorf("password_file %q: fleet_auth_failed %v; want 1", pf, got)
		}
		time.Sleep(3 * testReport) // it keeps retrying, and says so once
		if n := strings.Count(m.log.String(), "level=ERROR"); n != 1 || !strings.Contains(m.log.String(), "refuses the credentials") {
			t.Errorf("password_file %q: %d ERROR lines; want 1 saying the credentials are refused:\n%s", pf, n, m.log)
		}
		if strings.Contains(m.log.String(), "battery-staple") {
			t.Errorf("the log shows the password:\n%s", m.log)
		}
		m.c.Close()
	}
	cfg := testConfig(r.URL(), "pw", "a")
	cfg.PasswordFile = right
	m := join(t, cfg, 10)
	if got := metric(t, m.c, "tierlimit_fleet_store_up"); got != 1 {
		t.Errorf("fleet_store_up %v with the right password; want 1", got)
	}
	// Reload reads the file again; the same store keeps the controller.
	if err := m.c.Reload(cfg); err != nil {
		t.Errorf("Reload: %v", err)
	}
	other := cfg
	other.Name = "pw2"
	if err := m.c.Reload(other); !errors.Is(err, fleet.ErrRestart) {
		t.Errorf("Reload to another fleet: %v; want ErrRestart", err)
	}

	// The store's password changes under the member: its reports are
	// refused (said once), it falls back after ttl; password_file gets
	// the new one and a Reload brings the member back.
	admin := redis.NewClient(&redis.Options{Addr: r.Addrs[0], Password: "right-horse"})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "requirepass", "new-horse").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if !waitFor(40, func() bool { in, _, _, _ := m.a.state(); return in }) {
		t.Fatalf("the member is not in fallback with its password refused")
	}
	if n := strings.Count(m.log.String(), "refuses the credentials"); n != 1 {
		t.Errorf("%d log lines say the credentials are refused; want 1:\n%s", n, m.log)
	}
	if strings.Contains(m.log.String(), "horse") {
		t.Errorf("the log shows a password:\n%s", m.log)
	}
	os.WriteFile(right, []byte("new-horse\n"), 0o600)
	if err := m.c.Reload(cfg); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if !waitFor(20, func() bool { in, _, _, _ := m.a.state(); return !in }) {
		t.Fatalf("the member did not rejoin with the new password")
	}
}

// TestFleetUnreachableAtStart: a store out of reach at start is a warning
// and fallback (with no members seen), and the member joins once the store
// answers.
func TestFleetUnreachableAtStart(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	r.Kill(t)
	m := join(t, testConfig(r.URL(), "u", "a"), 10)
	in, entered, _, _ := m.a.state()
	if !in || len(entered) != 1 || entered[0] != 0 {
		t.Fatalf("fallback %v, EnterFallback %v; want in fallback with 0 members seen", in, entered)
	}
	if !strings.Contains(m.log.String(), "level=WARN") || !strings.Contains(m.log.String(), "starting in fallback") {
		t.Errorf("no warning at start:\n%s", m.log)
	}
	if got := metric(t, m.c, "tierlimit_fleet_fallback"); got != 1 {
		t.Errorf("fleet_fallback %v; want 1", got)
	}
	r.Restart(t)
	if !waitFor(20, func() bool { in, _, _, _ := m.a.state(); return !in }) {
		t.Fatalf("did not join when the store came up")
	}
	if got := metric(t, m.c, "tierlimit_fleet_members"); got != 1 {
		t.Errorf("fleet_members %v; want 1", got)
	}
}

// TestFleetCluster: the sharing test on a Redis Cluster of 3 masters (one
// fleet's keys in one hash slot: a script over several slots fails).
func TestFleetCluster(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Cluster: 3})
	sharing(t, r.URL(), "")
}

// TestFleetTLS: the sharing test on a TLS-only store, trusted through
// ca_file; without ca_file the certificate is not trusted and the member
// stays in fallback.
func TestFleetTLS(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{TLS: true})
	sharing(t, r.URL(), r.CAFile)
	m := join(t, testConfig(r.URL(), "tls2", "x"), 1)
	if in, _, _, _ := m.a.state(); !in {
		t.Errorf("joined a TLS store whose CA it was not given")
	}
}

// TestFleetSentinel: the sharing test through a Sentinel, to a master with
// a password (password_file reaches the master; the Sentinel has none).
func TestFleetSentinel(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Sentinel: true, Password: "s3ntinel-pw"})
	pf := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pf, []byte("s3ntinel-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ms []*member
	for i, est := range []uint64{60, 30, 10} {
		cfg := testConfig(r.URL(), "sent", string(rune('a'+i)))
		cfg.PasswordFile = pf
		ms = append(ms, join(t, cfg, est))
	}
	shares(t, 20, ms...)
	for _, m := range ms {
		if in, entered, _, _ := m.a.state(); in || len(entered) > 0 {
			t.Errorf("member %s: in fallback through the Sentinel", m.name)
		}
	}
}

// fleetACL is the ACL that limits a member to its fleet's keys
// (docs/design.md §12, Trust): the scripts' commands on the keys of one
// hash tag, and nothing else.
const fleetACL = "on >member-pw resetkeys ~{tierlimit:fleet:acl}:* resetchannels -@all +hello +auth +ping +client|setname +evalsha +eval " +
	"+time +get +set +del +pttl +pexpire +hget +hset +hdel +hlen +hgetall +zadd +zrem +zcard +zrangebyscore"

// aclStore starts a store with the ACL user "member" of fleetACL and
// returns it, its URL as that user and the user's password file.
func aclStore(t *testing.T) (r *testenv.Redis, store, passwordFile string) {
	t.Helper()
	r = testenv.StartRedis(t, testenv.RedisOptions{})
	r.CLI(t, 0, append([]string{"acl", "setuser", "member"}, strings.Fields(fleetACL)...)...)
	passwordFile = filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(passwordFile, []byte("member-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return r, strings.Replace(r.URL(), "redis://", "redis://member@", 1), passwordFile
}

// TestFleetACL: members that log in as an ACL user limited to the fleet's
// keys share as any member does, and the same user refused another
// fleet's keys is ErrAuth at start.
func TestFleetACL(t *testing.T) {
	_, store, pf := aclStore(t)
	var ms []*member
	for i, est := range []uint64{60, 30, 10} {
		cfg := testConfig(store, "acl", string(rune('a'+i)))
		cfg.PasswordFile = pf
		ms = append(ms, join(t, cfg, est))
	}
	shares(t, 20, ms...)
	if st, err := ms[0].c.Members(context.Background()); err != nil || len(st) != 3 {
		t.Errorf("Members as the ACL user: %v, %d members", err, len(st))
	}
	cfg := testConfig(store, "other", "x")
	cfg.PasswordFile = pf
	x := join(t, cfg, 1)
	if got := metric(t, x.c, "tierlimit_fleet_auth_failed"); got != 1 || !strings.Contains(x.log.String(), "NOPERM") {
		t.Errorf("another fleet's keys as the ACL user: fleet_auth_failed %v, log:\n%s\nwant 1 and NOPERM", got, x.log)
	}
	if _, err := fleet.Status(context.Background(), cfg); !errors.Is(err, fleet.ErrAuth) {
		t.Errorf("Status of another fleet as the ACL user: %v; want ErrAuth", err)
	}
}

// TestFleetClusterTLS: the sharing test on a TLS-only Redis Cluster
// (rediss+cluster://, every node's certificate checked against ca_file).
func TestFleetClusterTLS(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Cluster: 3, TLS: true})
	sharing(t, r.URL(), r.CAFile)
}

// TestFleetBound: a member with Config.Bound (the agent's fold for max:
// auto, docs/design.md §12) writes Bound(own, sums) into its program,
// never less than the store's sums, while its fleet_others metric and what
// the other members see stay the store's: the bound is the member's own.
func TestFleetBound(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	cfg := testConfig(r.URL(), "bound", "auto")
	type call struct{ own, sum fleet.Sums }
	calls := make(chan call, 1000)
	cfg.Bound = func(own, sum fleet.Sums) fleet.Sums {
		select {
		case calls <- call{own, sum}:
		default:
		}
		if own.Total == 0 {
			return fleet.Sums{} // less than the sums: the controller writes them
		}
		return fleet.Sums{In: sum.In + 10*own.In, Total: sum.Total + 10*own.Total}
	}
	auto := joinPair(t, cfg, 150, 200)
	other := joinPair(t, testConfig(r.URL(), "bound", "other"), 500, 700)
	if !waitFor(20, func() bool {
		in, tot := auto.k.othersPair()
		oin, otot := other.k.othersPair()
		return in == 500+1500 && tot == 700+2000 && oin == 150 && otot == 200
	}) {
		in, tot := auto.k.othersPair()
		oin, otot := other.k.othersPair()
		t.Fatalf("others: the bound member %d, %d, want 500 + 10 × 150, 700 + 10 × 200; the other %d, %d, want 150, 200", in, tot, oin, otot)
	}
	if got := metric(t, auto.c, "tierlimit_fleet_others"); got != 700 {
		t.Errorf("fleet_others %v; want the store's sum 700", got)
	}
	if c := <-calls; c.own != (fleet.Sums{In: 150, Total: 200}) {
		t.Errorf("Bound called with own %+v; want the member's estimates 150, 200", c.own)
	}
	auto.k.set(0)
	if !waitFor(20, func() bool { in, tot := auto.k.othersPair(); return in == 500 && tot == 700 }) {
		in, tot := auto.k.othersPair()
		t.Errorf("a bound below the sums: others %d, %d; want the sums 500, 700", in, tot)
	}
}
