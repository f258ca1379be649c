package fleet_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestFleetDistance (issue 40, item 4): a store 40 or 80 ms away (round
// trip, through a delay proxy) with report 100 ms is joined and stays
// joined, through a reconnection (every connection cut): a report's
// deadline never tears down its connection, so a new connection's dial,
// HELLO and script, three round trips, complete across reports. The proxy
// sees one connection, and one more after the cut.
func TestFleetDistance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	for _, rtt := range []time.Duration{40 * time.Millisecond, 80 * time.Millisecond} {
		t.Run(rtt.String(), func(t *testing.T) {
			p := startProxy(t, r.Addrs[0], rtt)
			name := fmt.Sprintf("far%d", rtt.Milliseconds())
			near := join(t, testConfig(r.URL(), name, "near"), 100)
			far := join(t, testConfig("redis://"+p.addr(), name, "far"), 300)
			shares(t, 20, near, far)
			stays := func(what string, d time.Duration) {
				t.Helper()
				deadline := time.Now().Add(d)
				for time.Now().Before(deadline) {
					if in, entered, _, _ := far.a.state(); in || len(entered) > 0 {
						t.Fatalf("%s: the far member fell back (EnterFallback %v) with the store %v away:\n%s", what, entered, rtt, far.log)
					}
					time.Sleep(testReport / 2)
				}
			}
			stays("joined", 2*time.Second)
			if n := p.accepted.Load(); n != 1 {
				t.Errorf("the far member opened %d connections in 2 s of a store %v away; want 1", n, rtt)
			}
			p.cut()
			stays("after a cut", 3*time.Second)
			shares(t, 20, near, far)
			if n := p.accepted.Load(); n > 3 {
				t.Errorf("the far member opened %d connections through one cut; want at most 3", n)
			}
			ok := metric(t, far.c, "tierlimit_fleet_reports_total", `result="ok"`)
			slow := metric(t, far.c, "tierlimit_fleet_reports_total", `result="slow"`)
			t.Logf("store %v away: reports ok %v, slow %v, error %v; connections %d", rtt, ok, slow,
				metric(t, far.c, "tierlimit_fleet_reports_total", `result="error"`), p.accepted.Load())
			if ok < 30 {
				t.Errorf("%v reports ok in 5 s at report %v; want >= 30", ok, testReport)
			}
		})
	}
}

// TestFleetStorePausedConnections (issue 40, item 4): a store that hangs
// (SIGSTOP) for 3 s is not dialled at every report: a report waits on its
// connection up to ttl, and a reconnection backs off, so the member opens
// at most pause/ttl + 3 connections, and rejoins after SIGCONT.
func TestFleetStorePausedConnections(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := startProxy(t, r.Addrs[0], 0)
	a := join(t, testConfig("redis://"+p.addr(), "paused", "a"), 100)
	b := join(t, testConfig(r.URL(), "paused", "b"), 300)
	shares(t, 20, a, b)
	before := p.accepted.Load()
	const pause = 3 * time.Second
	r.Signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { r.Signal(t, syscall.SIGCONT) })
	time.Sleep(pause)
	r.Signal(t, syscall.SIGCONT)
	n := p.accepted.Load() - before
	t.Logf("connections while paused %v: %d", pause, n)
	if max := int64(pause/testTTL) + 3; n > max {
		t.Errorf("the member opened %d connections to a store paused %v; want at most pause/ttl + 3 = %d", n, pause, max)
	}
	if !waitFor(40, func() bool { in, _, _, _ := a.a.state(); return !in }) {
		t.Fatalf("a did not rejoin after SIGCONT:\n%s", a.log)
	}
	shares(t, 20, a, b)
	if strings.Count(a.log.String(), "rejoined") > 1 {
		t.Errorf("a rejoined more than once:\n%s", a.log)
	}
}
