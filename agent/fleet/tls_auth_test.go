package fleet_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// refusedAndWaiting checks that m is in fallback with its credentials
// refused (fleet_auth_failed 1, one ERROR), within n reports.
func refusedAndWaiting(t *testing.T, m *member, n int, what string) {
	t.Helper()
	if !waitFor(n, func() bool { return metric(t, m.c, "tierlimit_fleet_auth_failed") == 1 }) {
		t.Errorf("%s: fleet_auth_failed %v; want 1:\n%s", what, metric(t, m.c, "tierlimit_fleet_auth_failed"), m.log)
	}
	if in, _, _, _ := m.a.state(); !in {
		t.Errorf("%s: not in fallback", what)
	}
	if c := strings.Count(m.log.String(), "level=ERROR"); c != 1 {
		t.Errorf("%s: %d ERROR lines; want 1:\n%s", what, c, m.log)
	}
}

// TestFleetClientCertificate (issue 40, item 5): a TLS store with Redis's
// default tls-auth-clients yes is joined with cert_file and key_file;
// without them the store refuses the connection: the member starts in
// fallback with fleet_auth_failed 1.
func TestFleetClientCertificate(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{TLS: true, ClientAuth: true})
	var ms []*member
	for i, est := range []uint64{70, 30} {
		cfg := testConfig(r.URL(), "mtls", string(rune('a'+i)))
		cfg.CAFile, cfg.CertFile, cfg.KeyFile = r.CAFile, r.ClientCert, r.ClientKey
		ms = append(ms, join(t, cfg, est))
	}
	shares(t, 20, ms...)
	cfg := testConfig(r.URL(), "mtls", "nocert")
	cfg.CAFile = r.CAFile
	refusedAndWaiting(t, join(t, cfg, 1), 20, "no client certificate")
}

// TestFleetSentinelTLSServerName (issue 40, item 5): a Sentinel and its
// master behind TLS whose certificate names a DNS name only: the Sentinel
// announces the master by IP, so the member checks each certificate
// against server_name; without it the check fails and the member stays in
// fallback, with fleet_auth_failed 1, not "out of reach".
func TestFleetSentinelTLSServerName(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Sentinel: true, TLS: true, CertDNS: "store.test"})
	if !strings.HasPrefix(r.URL(), "rediss+sentinel://127.0.0.1:") {
		t.Fatalf("store URL %s; want rediss+sentinel:// to an IP", r.URL())
	}
	var ms []*member
	for i, est := range []uint64{60, 40} {
		cfg := testConfig(r.URL(), "sntls", string(rune('a'+i)))
		cfg.CAFile, cfg.ServerName = r.CAFile, "store.test"
		ms = append(ms, join(t, cfg, est))
	}
	shares(t, 20, ms...)
	cfg := testConfig(r.URL(), "sntls", "noname")
	cfg.CAFile = r.CAFile
	m := join(t, cfg, 1)
	refusedAndWaiting(t, m, 30, "no server_name")
	if !strings.Contains(m.log.String(), "store.test") {
		t.Errorf("the ERROR does not say which name the certificate holds:\n%s", m.log)
	}
}

// TestFleetSentinelPassword (issue 40, item 5): Sentinels with their own
// requirepass (and a master with another password) are reached with
// sentinel_password_file; without it the member cannot learn the master
// and stays in fallback.
func TestFleetSentinelPassword(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Sentinel: true, Password: "master-pw", SentinelPassword: "sentinel-pw"})
	dir := t.TempDir()
	mpw, spw := filepath.Join(dir, "master"), filepath.Join(dir, "sentinel")
	os.WriteFile(mpw, []byte("master-pw\n"), 0o600)
	os.WriteFile(spw, []byte("sentinel-pw\n"), 0o600)
	var ms []*member
	for i, est := range []uint64{60, 40} {
		cfg := testConfig(r.URL(), "snpw", string(rune('a'+i)))
		cfg.PasswordFile, cfg.SentinelPasswordFile = mpw, spw
		ms = append(ms, join(t, cfg, est))
	}
	shares(t, 20, ms...)
	cfg := testConfig(r.URL(), "snpw", "nopw")
	cfg.PasswordFile = mpw
	m := join(t, cfg, 1)
	refusedAndWaiting(t, m, 30, "no sentinel_password_file")
}

// TestFleetSentinelMasterDown (issue 40, item 4): while a Sentinel's
// master is down (its address takes connections and hangs up) the member
// keeps one Sentinel client: it opens no new Sentinel connection, and at
// most 2 connections a second to the master's address (the backoff's cap
// of 1 s, jittered down to 0.5 s).
func TestFleetSentinelMasterDown(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Sentinel: true})
	var ms []*member
	for i, est := range []uint64{60, 40} {
		ms = append(ms, join(t, testConfig(r.URL(), "sndown", string(rune('a'+i))), est))
	}
	shares(t, 20, ms...)
	r.KillNode(t, 0)
	master := hangUp(t, r.Addrs[0])
	time.Sleep(time.Second) // past the first failures
	s0, m0 := sentinelConnections(t, r), master.Load()
	const period = 5 * time.Second
	time.Sleep(period)
	s1, m1 := sentinelConnections(t, r), master.Load()
	perS := func(n int64) float64 { return float64(n) / float64(len(ms)) / period.Seconds() }
	t.Logf("master down %v, %d members: %.2f Sentinel connections and %.2f master connections per member per second",
		period, len(ms), perS(s1-s0-1), perS(m1-m0))
	if got := perS(s1 - s0 - 1); got > 0.2 { // less the test's own redis-cli
		t.Errorf("%.2f Sentinel connections per member per second while the master is down; want none (one client, built once)", got)
	}
	if got := perS(m1 - m0); got > 2 {
		t.Errorf("%.2f connections per member per second to the master's address while it is down; want at most 2", got)
	}
	for _, m := range ms {
		if in, _, _, _ := m.a.state(); !in {
			t.Errorf("member %s not in fallback with its master down", m.name)
		}
	}
}

// sentinelConnections is the Sentinel's count of connections it accepted.
func sentinelConnections(t *testing.T, r *testenv.Redis) int64 {
	t.Helper()
	for _, line := range strings.Split(r.CLI(t, 1, "info", "stats"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("the Sentinel's INFO has no total_connections_received")
	return 0
}
