package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// The case (issue 15), scaled down by 10 for a shared 2-core
// machine: a syslog flood of 5,000 datagrams/s (the 50,000) into a
// collector that reads 1,000/s (10,000), then 3,000/s (30,000). The ratios
// and every check are the issue's; the window is 500 ms, so that the
// adaptive max per window starts at 40,000/s × 1/10 × 0.5 s = 2,000.
const (
	autoWindow  = 500 * time.Millisecond
	autoOffered = 5000 // datagrams per second
	autoSlow    = 1000 // the collector's datagrams per second
	autoFast    = 3000
	autoStart   = 2000 // per window
	// autoRcvbuf is the collector's SO_RCVBUF: the kernel doubles it to
	// 1 MiB, about 950 datagrams (truesize ≈ 1.1 KiB on this veth): two
	// windows of the slow collector's reading, enough for the burst that
	// the first tier passes at the start of each window, and less than half
	// a second of the fixed max's excess.
	autoRcvbuf = 512 << 10
	// autoPass is the share of max that the seed's tiers pass under a
	// flood: 70% + 10% × 0.8 + 20% × 0.5.
	autoPass = 0.88
)

func autoTestPolicy(t *testing.T, auto bool) tiers.Policy {
	t.Helper()
	max := fmt.Sprint(autoStart)
	if auto {
		max = fmt.Sprintf("auto\nauto: {start: %d}", autoStart)
	}
	p, err := tiers.ParseYAML([]byte(fmt.Sprintf("window: %s\nmax: %s\nselect: [{proto: udp, ports: [514]}]\n", autoWindow, max)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAutoMaxSlowCollector is the acceptance test on a real veth
// with a real collector socket. It runs, in one flood:
//
//  0. max: auto with no collector socket yet: max held, said once;
//  1. a fixed max (the start): the collector's socket drops thousands of
//     datagrams per second;
//  2. max: auto (a reload): within 15 windows the socket drops fall under
//     1% of offered (in each of the last 3 of the 15), the collector still
//     reads ≥ 90% of its rate (over the last 5), and the loss moves to
//     selected_packets_total{verdict="drop"} (over the last 5: the limiter
//     drops ≥ 60% of offered, the socket < 1%);
//  3. the collector speeds up 3×: within 30 windows max climbs back to
//     ≥ 90% of what the faster collector takes.
func TestAutoMaxSlowCollector(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	logs := &testenv.SyncBuffer{}
	a, err := newAgent(p, agent.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, autoTestPolicy(t, true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var src, probe automax.DropSource
	if err := p.Coll.Do(func() (err error) {
		if src, err = automax.OpenDropSource(false); err != nil {
			return err
		}
		probe, err = automax.OpenDropSource(false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	am, err := a.StartAutoMax(ctx, autoTestPolicy(t, true), src)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("signal: %s", am.Signal())
	r := &autoRun{t: t, p: p, a: a, am: am, logs: logs, probe: probe, dst: netip.AddrPortFrom(p.CollAddr, 514)}
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")
	r.flood(ctx)

	r.noCollector()
	// 1. A fixed max with the collector up.
	if err := a.Reload(context.Background(), autoTestPolicy(t, false)); err != nil {
		t.Fatal(err)
	}
	coll, err := sandbox.NewSlowCollector(p.Coll, r.dst, autoRcvbuf, autoSlow)
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	r.fixedMax(coll)
	r.autoMax(coll)
	r.reloadKeepsLearnt()
	r.speedUp(coll)
}

// autoRun is TestAutoMaxSlowCollector's state, shared by its phases.
type autoRun struct {
	t       *testing.T
	p       *testenv.Pair
	a       *agent.Agent
	am      *automax.Controller
	logs    *testenv.SyncBuffer
	probe   automax.DropSource
	dst     netip.AddrPort
	sendErr chan error
}

// flood starts one flood for the whole test, in the background.
func (r *autoRun) flood(ctx context.Context) {
	const total = 40 * time.Second
	tx := testenv.NewSender(r.t, r.p.Send, r.dst)
	r.sendErr = make(chan error, 1)
	go func() {
		_, err := tx.Pace(ctx, int(autoOffered*total.Seconds()), total, total+2*time.Second,
			func(i int) []byte { return testenv.SyslogMessage(0, i) })
		r.sendErr <- err
	}()
}

// windows waits n autoWindows, failing if the flood ends meanwhile.
func (r *autoRun) windows(n int) {
	select {
	case <-time.After(time.Duration(n) * autoWindow):
	case err := <-r.sendErr:
		r.t.Fatalf("flood ended early: %v", err)
	}
}

// judged waits until n windows after from have been judged: limiter
// windows, which open at traffic and run a little over autoWindow.
func (r *autoRun) judged(from, n int) {
	t, am := r.t, r.am
	t.Helper()
	for deadline := time.Now().Add(time.Duration(3*n) * autoWindow); len(am.History()) < from+n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d windows judged in %v, want %d", len(am.History())-from, time.Duration(3*n)*autoWindow, n)
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case err := <-r.sendErr:
			t.Fatalf("flood ended early: %v", err)
		}
	}
}

// noCollector is phase 0: no collector socket: max held at start, said once.
func (r *autoRun) noCollector() {
	t := r.t
	r.windows(6)
	if got := r.am.Max(); got != autoStart {
		t.Errorf("no collector socket: max %d, want held at %d", got, autoStart)
	}
	if n := strings.Count(r.logs.String(), "no collector socket"); n != 1 {
		t.Errorf("said %d times that there is no collector socket, want once", n)
	}
}

// fixedMax is phase 1: a fixed max with the collector up: its socket drops.
func (r *autoRun) fixedMax(coll *sandbox.SlowCollector) {
	t := r.t
	r.windows(2)
	ports := []tiers.PortRange{{First: 514, Last: 514}}
	r.probe.Read(ports)
	t0, r0 := time.Now(), coll.Read()
	r.windows(6)
	s, err := r.probe.Read(ports)
	if err != nil {
		t.Fatal(err)
	}
	secs := time.Since(t0).Seconds()
	fixedDrops := float64(s.Drops) / secs
	t.Logf("fixed max %d: collector socket drops %.0f/s, collector reads %.0f/s", autoStart, fixedDrops, float64(coll.Read()-r0)/secs)
	if fixedDrops < 1000 {
		t.Errorf("fixed max: %.0f socket drops/s, want thousands (the issue's tens of thousands, scaled)", fixedDrops)
	}
}

// autoMax is phase 2: max: auto.
func (r *autoRun) autoMax(coll *sandbox.SlowCollector) {
	t, a, am := r.t, r.a, r.am
	if err := a.Reload(context.Background(), autoTestPolicy(t, true)); err != nil {
		t.Fatal(err)
	}
	m0 := gather(t, a)
	from := len(am.History())
	r.judged(from, 10)
	t1, r1, m1 := time.Now(), coll.Read(), gather(t, a)
	r.judged(from, 15)
	t2, r2, m2 := time.Now(), coll.Read(), gather(t, a)
	slowWins := am.History()[from : from+15]
	logTrajectory(t, "slow", slowWins)
	// The drops have fallen under 1% of offered by the end of the 15
	// windows: in each of the last three.
	for _, w := range slowWins[len(slowWins)-3:] {
		if float64(w.SocketDrops) >= 0.01*float64(w.Offered) {
			t.Errorf("window %d (of the last 3 of 15): %d socket drops ≥ 1%% of %d offered", w.Window, w.SocketDrops, w.Offered)
		}
	}
	rate := float64(r2-r1) / t2.Sub(t1).Seconds()
	t.Logf("last 5 windows: collector reads %.0f/s of its %d/s", rate, autoSlow)
	if rate < 0.9*autoSlow {
		t.Errorf("collector reads %.0f/s, want ≥ 90%% of %d/s", rate, autoSlow)
	}
	limDrops := m2.sum("tierlimit_selected_packets_total", `verdict="drop"`) - m1.sum("tierlimit_selected_packets_total", `verdict="drop"`)
	sockDrops := m2["tierlimit_collector_socket_drops_total"] - m1["tierlimit_collector_socket_drops_total"]
	t.Logf("last 5 windows: selected drops %.0f, collector socket drops %.0f", limDrops, sockDrops)
	offered := m2.sum("tierlimit_selected_packets_total") - m1.sum("tierlimit_selected_packets_total")
	if limDrops < 0.6*offered || sockDrops >= 0.01*offered {
		t.Errorf("the loss is not in selected_packets_total{verdict=drop}: limiter %.0f, socket %.0f of %.0f offered", limDrops, sockDrops, offered)
	}
	if m2["tierlimit_policy_max_packets"] != float64(am.Max()) || m2[`tierlimit_auto_max_adjustments_total{direction="down"}`] <= m0[`tierlimit_auto_max_adjustments_total{direction="down"}`] {
		t.Errorf("metrics: policy_max_packets %v (max %d), adjustments down %v", m2["tierlimit_policy_max_packets"], am.Max(),
			m2[`tierlimit_auto_max_adjustments_total{direction="down"}`])
	}
}

// reloadKeepsLearnt checks that a reload of the same file keeps the learnt
// max (the controller may move it by a step meanwhile, but it does not
// start again).
func (r *autoRun) reloadKeepsLearnt() {
	t, a, am := r.t, r.a, r.am
	learnt := am.Max()
	if err := a.Reload(context.Background(), autoTestPolicy(t, true)); err != nil {
		t.Fatal(err)
	}
	if got, act := am.Max(), gather(t, a)["tierlimit_policy_max_packets"]; got > learnt*12/10 || act > float64(learnt)*1.2 ||
		!strings.Contains(r.logs.String(), "reload keeps the learnt max") {
		t.Errorf("reload with unchanged auto: max %d, policy_max_packets %v; want the learnt %d, not start %d", got, act, learnt, autoStart)
	}
}

// speedUp is phase 3: the collector speeds up.
func (r *autoRun) speedUp(coll *sandbox.SlowCollector) {
	t, a, am := r.t, r.a, r.am
	coll.SetRate(autoFast)
	from := len(am.History())
	want := uint64(0.9 * autoFast * autoWindow.Seconds() / autoPass)
	reached := -1
	for i := 0; i < 30 && reached < 0; i++ {
		r.judged(from, i+1)
		if am.History()[from+i].Max >= want {
			reached = i + 1
		}
	}
	logTrajectory(t, "fast", am.History()[from:])
	if reached < 0 {
		t.Errorf("max %d after 30 windows, want ≥ %d (90%% of what %d/s takes)", am.Max(), want, autoFast)
	} else {
		t.Logf("max reached %d (≥ %d) in %d windows", am.Max(), want, reached)
	}
	if m := gather(t, a); m[`tierlimit_auto_max_adjustments_total{direction="up"}`] < 1 {
		t.Errorf("no adjustment up counted")
	}
}

func logTrajectory(t *testing.T, phase string, ws []automax.Window) {
	t.Helper()
	for i, w := range ws {
		t.Logf("%s window %2d: offered %5d delivered %5d socket drops %5d buffer %3.0f%% max %5d %s",
			phase, i+1, w.Offered, w.Delivered, w.SocketDrops, 100*w.Full, w.Max, w.Change)
	}
}
