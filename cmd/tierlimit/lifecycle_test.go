package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// The lifecycle tests (DESIGN.md §2 Reload, Restart; §4 status, detach) run
// the real binary in the collector namespace, as an operator would, with
// `nsenter --net` (not `ip netns exec`, whose private /sys hides the pins).

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// cli builds the tierlimit binary once per test run.
func cli(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tierlimit-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "tierlimit")
		out, err := exec.Command("go", "build", "-o", cliPath, ".").CombinedOutput()
		if err != nil {
			cliErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliPath
}

// agentProc is `tierlimit run` running in a namespace.
type agentProc struct {
	cmd  *exec.Cmd
	log  *testenv.SyncBuffer
	done chan struct{}
}

// startRun starts `tierlimit run args...` inside ns and waits for its
// "started" log line. Cleanup kills it if it still runs.
func startRun(t *testing.T, ns *testenv.NS, args ...string) *agentProc {
	t.Helper()
	p := spawnRun(t, ns, nil, args...)
	if !p.waitLog("msg=started", 15*time.Second) {
		t.Fatalf("tierlimit run did not start:\n%s", p.log)
	}
	return p
}

// spawnRun starts `tierlimit run args...` inside ns, logging into the
// agentProc's log, and returns at once. setup, if not nil, can change the
// command (its stderr, its environment) before it starts. Cleanup kills it
// if it still runs.
func spawnRun(t *testing.T, ns *testenv.NS, setup func(*exec.Cmd), args ...string) *agentProc {
	t.Helper()
	p := &agentProc{log: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = ns.Command(context.Background(), cli(t), append([]string{"run"}, args...)...)
	p.cmd.Stderr = p.log
	p.cmd.Stdout = p.log
	// The episode state file (DESIGN.md §10) goes to the test's dir.
	p.cmd.Env = append(os.Environ(), "STATE_DIRECTORY="+t.TempDir())
	if setup != nil {
		setup(p.cmd)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// alive reports whether the process still runs.
func (p *agentProc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *agentProc) waitLog(s string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if strings.Contains(p.log.String(), s) {
			return true
		}
		select {
		case <-p.done:
			return strings.Contains(p.log.String(), s)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false
}

func (p *agentProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	// nsenter execs the command, so the pid is tierlimit's.
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

func (p *agentProc) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	p.signal(t, sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("tierlimit did not exit on %v", sig)
	}
}

// scrape reads the agent's /metrics inside ns: name{labels} -> value.
func scrape(t *testing.T, ns *testenv.NS) map[string]float64 {
	t.Helper()
	status, body, err := testenv.Get(ns, "http://127.0.0.1:9713/metrics")
	if err != nil || status != 200 {
		t.Fatalf("scrape: %d %v", status, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := name
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			}
		}
	}
	return out
}

// sum adds the metrics named name whose labels include every one of match.
func sum(m map[string]float64, name string, match ...string) float64 {
	var s float64
	for k, v := range m {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, want := range match {
			ok = ok && strings.Contains(k, want)
		}
		if ok {
			s += v
		}
	}
	return s
}

// testPin is a fresh pin directory for p's collector veth. Cleanup detaches
// whatever the test left attached there, then removes the directory.
func testPin(t *testing.T, p *testenv.Pair) string {
	t.Helper()
	pin := testenv.PinPath(t, agent.LockFile)
	t.Cleanup(func() {
		p.Coll.Command(context.Background(), cli(t), "detach", "--iface", p.CollIf, "--pin-path", pin).Run()
	})
	return pin
}

// pinnedSetup makes a namespace pair, a pin path and a config file holding
// body, for tests that run a pinned agent.
func pinnedSetup(t *testing.T, body string) (p *testenv.Pair, pin, cfg string) {
	t.Helper()
	p = testenv.NewPair(t)
	pin = testPin(t, p)
	cfg = filepath.Join(t.TempDir(), "tierlimit.yaml")
	writeConfig(t, cfg, body)
	return p, pin, cfg
}

func writeConfig(t *testing.T, path, body string) {
	t.Helper()
	// Write a new file and rename it over the old one, as editors do.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Two policies on 200 ms windows. Offered 1000 selected packets per
// window (5000 pps), lenient passes all of them and strict about 87
// (tiers.Expected with max 100: 69 + 0.8·10 + 0.5·20).
const (
	lenientYAML = "window: 200ms\nmax: 1000000\nselect: [{proto: udp, ports: [514]}]\n"
	strictYAML  = "window: 200ms\nmax: 100\nselect: [{proto: udp, ports: [514]}]\n"
	pps         = 5000
)

type flood struct {
	cancel context.CancelFunc
	done   chan struct{}
	sent   int
	err    error
}

// startFlood sends UDP/514 syslog at pps from the sender namespace for at
// most limit, until stopped.
func startFlood(t *testing.T, p *testenv.Pair, limit time.Duration) *flood {
	t.Helper()
	s := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	f := &flood{cancel: cancel, done: make(chan struct{})}
	count := int(limit.Seconds() * pps)
	go func() {
		defer close(f.done)
		f.sent, f.err = s.Pace(ctx, count, limit, limit, func(i int) []byte { return testenv.SyslogMessage(0, i) })
		if f.err == context.Canceled || f.err == context.DeadlineExceeded {
			f.err = nil
		}
	}()
	t.Cleanup(f.stop)
	return f
}

func (f *flood) stop() {
	f.cancel()
	<-f.done
}

// passRate measures, from the metrics over three 200 ms windows, the
// selected packets passed per window and the share of the offered
// (selected) packets that passed, and checks that no counter decreases.
// The share does not depend on how fast the sender managed to send.
func passRate(t *testing.T, ns *testenv.NS, prev *map[string]float64) (perWindow, share float64) {
	t.Helper()
	a := scrape(t, ns)
	monotone(t, *prev, a)
	time.Sleep(600 * time.Millisecond)
	b := scrape(t, ns)
	monotone(t, a, b)
	*prev = b
	delta := func(match ...string) float64 {
		return sum(b, "tierlimit_selected_packets_total", match...) - sum(a, "tierlimit_selected_packets_total", match...)
	}
	pass, offered := delta("verdict=pass"), delta()
	if offered < 300 {
		t.Fatalf("only %v selected packets offered in 3 windows: the flood stalled", offered)
	}
	return pass / 3, pass / offered
}

// checkFollows fails t unless the passed traffic is the strict policy's
// (about 87 of ~1000 offered per window: at most 300, and some dropped) or
// the lenient one's (everything passes).
func checkFollows(t *testing.T, what string, strict bool, perWindow, share float64) {
	t.Helper()
	if strict && (perWindow > 300 || share > 0.5) || !strict && share < 0.999 {
		t.Fatalf("%s (strict=%v): %.0f passed per window, %.1f%% of the offered", what, strict, perWindow, 100*share)
	}
}

func monotone(t *testing.T, a, b map[string]float64) {
	t.Helper()
	for k, v := range a {
		if strings.HasPrefix(k, "tierlimit_selected_packets_total") && b[k] < v {
			t.Fatalf("%s decreased from %v to %v", k, v, b[k])
		}
	}
}

// TestReloadUnderFlood switches a flooded agent between a lenient and a
// strict policy 20 times by rewriting its config file (saved by rename):
// the passed rate follows each policy within one window, every reload
// counts as a success, and no counter ever decreases. Then a bad file is
// refused, with the old policy still limiting and the key in the log, and a
// fixed file and a SIGHUP reload again.
func TestReloadUnderFlood(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, lenientYAML)
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--pin-path", pin)
	f := startFlood(t, p, 60*time.Second)

	prev := scrape(t, p.Coll)
	reloads := func() float64 { return sum(scrape(t, p.Coll), "tierlimit_config_reloads_total", "result=success") }
	waitReloads := func(want float64, key string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if got := sum(scrape(t, p.Coll), "tierlimit_config_reloads_total", key); got >= want {
				if got > want {
					t.Fatalf("%s reloads: %v, want %v", key, got, want)
				}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s reloads did not reach %v:\n%s", key, want, a.log)
	}

	for i := 1; i <= 20; i++ {
		strict := i%2 == 1
		writeConfig(t, cfg, map[bool]string{true: strictYAML, false: lenientYAML}[strict])
		waitReloads(float64(i), "result=success")
		time.Sleep(200 * time.Millisecond) // one window
		perWindow, share := passRate(t, p.Coll, &prev)
		checkFollows(t, fmt.Sprintf("reload %d", i), strict, perWindow, share)
	}
	if got := reloads(); got != 20 {
		t.Fatalf("config_reloads_total{result=success} = %v, want 20", got)
	}

	// A bad file is refused: the old (lenient) policy keeps running.
	writeConfig(t, cfg, "window: 200ms\nmax: 100\ntiers:\n  - {at: 80%, drop: 20%}\n  - {at: 70%, drop: 50%}\n")
	waitReloads(1, "result=error")
	if !a.waitLog("tiers[1].at", 2*time.Second) {
		t.Fatalf("the log does not name the bad key:\n%s", a.log)
	}
	perWindow, share := passRate(t, p.Coll, &prev)
	checkFollows(t, "after a bad reload, the old lenient policy", false, perWindow, share)
	writeConfig(t, cfg, strictYAML)
	waitReloads(21, "result=success")
	a.signal(t, syscall.SIGHUP)
	waitReloads(22, "result=success")
	perWindow, share = passRate(t, p.Coll, &prev)
	checkFollows(t, "after fixing the file", true, perWindow, share)
	f.stop()
	if f.err != nil {
		t.Fatal(f.err)
	}
}

// xdpWatch polls the collector veth's XDP attachment every millisecond and
// records the program ids it saw and how many polls found none.
type xdpWatch struct {
	mu      sync.Mutex
	ids     map[uint32]bool
	without int
	polls   int
	stop    chan struct{}
	done    chan struct{}
}

func watchXDP(t *testing.T, p *testenv.Pair) *xdpWatch {
	t.Helper()
	var h *netlink.Handle
	err := p.Coll.Do(func() error {
		nsh, err := netns.Get()
		if err != nil {
			return err
		}
		defer nsh.Close()
		h, err = netlink.NewHandleAt(nsh)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &xdpWatch{ids: map[uint32]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer h.Close()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(time.Millisecond):
			}
			l, err := h.LinkByName(p.CollIf)
			w.mu.Lock()
			w.polls++
			if err != nil || l.Attrs().Xdp == nil || !l.Attrs().Xdp.Attached {
				w.without++
			} else {
				w.ids[l.Attrs().Xdp.ProgId] = true
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.close)
	return w
}

func (w *xdpWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// TestKillDashNineUnderFlood kills the agent with SIGKILL under a flood:
// limiting goes on while it is down, a restarted agent adopts the pinned
// state with no moment without XDP, and the counters neither reset nor
// double: pass + drop equals what was sent, pass equals what arrived.
func TestKillDashNineUnderFlood(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, strictYAML)
	recv := testenv.NewReceiver(t, p.Coll, netip.AddrPortFrom(p.CollAddr, 514))
	args := []string{"--iface", p.CollIf, "--config", cfg, "--pin-path", pin}
	first := startRun(t, p.Coll, args...)
	watch := watchXDP(t, p)
	f := startFlood(t, p, 30*time.Second)

	// received per window while the agent is down, from the receiver.
	rateDown := func() float64 {
		_, a := recv.Counts()
		time.Sleep(600 * time.Millisecond)
		_, b := recv.Counts()
		return float64(b-a) / 3
	}
	time.Sleep(time.Second)
	first.stop(t, syscall.SIGKILL)
	if r := rateDown(); r > 300 {
		t.Fatalf("agent down: %.0f received per window, want the strict policy's ~87", r)
	}
	second := startRun(t, p.Coll, args...)
	if !second.waitLog("adopted pinned link", time.Second) {
		t.Fatalf("restarted agent did not adopt the pinned link:\n%s", second.log)
	}
	time.Sleep(time.Second)
	f.stop()
	if f.err != nil {
		t.Fatal(f.err)
	}
	recv.WaitQuiet(300*time.Millisecond, 5*time.Second)
	watch.close()

	m := scrape(t, p.Coll)
	pass := sum(m, "tierlimit_selected_packets_total", "verdict=pass")
	drop := sum(m, "tierlimit_selected_packets_total", "verdict=drop")
	_, received := recv.Counts()
	if int(pass+drop) != f.sent {
		t.Errorf("pass %v + drop %v = %v, want the %d sent: counters reset or doubled", pass, drop, pass+drop, f.sent)
	}
	if int(pass) != received {
		t.Errorf("pass %v, but the receiver got %d", pass, received)
	}
	watch.mu.Lock()
	defer watch.mu.Unlock()
	if watch.without > 0 {
		t.Errorf("%d of %d polls found the interface without XDP", watch.without, watch.polls)
	}
	if len(watch.ids) < 2 {
		t.Errorf("program ids seen %v: the restart should replace the program in place", watch.ids)
	}
	t.Logf("sent %d, passed %v, dropped %v; %d polls, program ids %v", f.sent, pass, drop, watch.polls, watch.ids)
}

// TestPingSurvivesReloadAndRestart: `ping -i 0.01` across the veth loses
// nothing while the agent reloads three times, restarts with SIGTERM and
// restarts after SIGKILL.
func TestPingSurvivesReloadAndRestart(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, strictYAML)
	args := []string{"--iface", p.CollIf, "--config", cfg, "--pin-path", pin}
	a := startRun(t, p.Coll, args...)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	ping := p.Send.Command(ctx, "ping", "-n", "-q", "-c", "400", "-i", "0.01", p.CollAddr.String())
	ping.Stdout, ping.Stderr = &out, &out
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	for range 3 {
		a.signal(t, syscall.SIGHUP)
		time.Sleep(200 * time.Millisecond)
	}
	a.stop(t, syscall.SIGTERM)
	a = startRun(t, p.Coll, args...)
	time.Sleep(300 * time.Millisecond)
	a.stop(t, syscall.SIGKILL)
	a = startRun(t, p.Coll, args...)
	if err := ping.Wait(); err != nil {
		t.Fatalf("ping: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), " 0% packet loss") {
		t.Fatalf("ping lost packets:\n%s", out.String())
	}
	if n := strings.Count(a.log.String(), "msg=reloaded"); n != 0 {
		t.Logf("last agent reloaded %d times", n)
	}
}

// TestDryRunAndOff offers 3× max per window under dry-run, then off:
// nothing is dropped, dry-run's would_drop is within 5σ of what enforce
// would drop (tiers.Expected), and off still counts.
func TestDryRunAndOff(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	cfg := filepath.Join(t.TempDir(), "tierlimit.yaml")
	const windowYAML = "mode: %s\nwindow: 200ms\nmax: 200\nselect: [{proto: udp, ports: [514]}]\n"
	writeConfig(t, cfg, fmt.Sprintf(windowYAML, "dry-run"))
	recv := testenv.NewReceiver(t, p.Coll, netip.AddrPortFrom(p.CollAddr, 514))
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--no-pin")
	s := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	bursts := testenv.Bursts{Count: 5, PerBurst: 600, Spread: 120 * time.Millisecond, Budget: 170 * time.Millisecond, Period: 260 * time.Millisecond}
	pol, err := tiers.ParseYAML(fmt.Appendf(nil, windowYAML, "enforce"))
	if err != nil {
		t.Fatal(err)
	}

	offer := func() (sent int, expDrop, variance float64) {
		t.Helper()
		per, err := s.SendBursts(context.Background(), bursts)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range per {
			e, err := tiers.Expected(pol, uint64(n))
			if err != nil {
				t.Fatal(err)
			}
			sent += n
			expDrop += e.Dropped
			variance += e.Variance
		}
		recv.WaitQuiet(200*time.Millisecond, 5*time.Second)
		return sent, expDrop, variance
	}

	sent, expDrop, variance := offer()
	m := scrape(t, p.Coll)
	_, received := recv.Counts()
	wouldDrop := sum(m, "tierlimit_selected_packets_total", "verdict=would_drop")
	if received != sent || sum(m, "tierlimit_selected_packets_total", "verdict=drop") != 0 {
		t.Fatalf("dry-run: received %d of %d sent, dropped %v", received, sent, sum(m, "tierlimit_selected_packets_total", "verdict=drop"))
	}
	if bound := 5 * math.Sqrt(variance); math.Abs(wouldDrop-expDrop) > bound {
		t.Fatalf("dry-run: would_drop %v, enforce would drop %.1f ± %.1f (5σ)", wouldDrop, expDrop, bound)
	}
	t.Logf("dry-run: %d sent, all received; would_drop %v (enforce expects %.1f ± %.1f)", sent, wouldDrop, expDrop, 5*math.Sqrt(variance))

	writeConfig(t, cfg, fmt.Sprintf(windowYAML, "off"))
	if !a.waitLog("mode=off", 5*time.Second) {
		t.Fatalf("no reload to off:\n%s", a.log)
	}
	before := scrape(t, p.Coll)
	sent2, _, _ := offer()
	after := scrape(t, p.Coll)
	_, received2 := recv.Counts()
	if received2-received != sent2 {
		t.Fatalf("off: received %d of %d", received2-received, sent2)
	}
	d := func(v string) float64 {
		return sum(after, "tierlimit_selected_packets_total", v) - sum(before, "tierlimit_selected_packets_total", v)
	}
	if d("verdict=pass") != float64(sent2) || d("verdict=drop") != 0 || d("verdict=would_drop") != 0 {
		t.Fatalf("off: pass +%v drop +%v would_drop +%v, want +%d, 0, 0", d("verdict=pass"), d("verdict=drop"), d("verdict=would_drop"), sent2)
	}
}

// TestStatusMatchesMetricsAndDetach: after traffic, `status` and `status
// --json` (no agent running) show what /metrics showed; `detach` leaves no
// pinned file and no XDP program.
func TestStatusMatchesMetricsAndDetach(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, "window: 1h\nmax: 100\nselect: [{proto: udp, ports: [514]}]\n")
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--pin-path", pin)
	s := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	if _, err := s.Pace(context.Background(), 300, 100*time.Millisecond, 5*time.Second, func(i int) []byte { return testenv.SyslogMessage(0, i) }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	m := scrape(t, p.Coll)
	a.stop(t, syscall.SIGTERM)

	run := func(args ...string) string {
		t.Helper()
		out, err := p.Coll.Command(context.Background(), cli(t), append(args, "--pin-path", pin)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tierlimit %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var st struct {
		Interfaces []struct{ Iface, Mode string }
		Policy     struct {
			MaxPackets uint64 `json:"max_packets"`
		}
		Window struct {
			Packets uint64
			Tier    int
		}
		Selected []struct {
			Tier    int
			Verdict string
			Packets uint64
		}
		Unselected uint64 `json:"unselected_packets"`
	}
	if err := json.Unmarshal([]byte(run("status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Interfaces) != 1 || st.Interfaces[0].Iface != p.CollIf || st.Interfaces[0].Mode != "native" {
		t.Errorf("status interfaces %+v", st.Interfaces)
	}
	if st.Policy.MaxPackets != 100 || float64(st.Window.Packets) != m["tierlimit_window_packets"] || float64(st.Window.Tier) != m["tierlimit_current_tier"] {
		t.Errorf("status policy/window %+v %+v, metrics window %v tier %v", st.Policy, st.Window, m["tierlimit_window_packets"], m["tierlimit_current_tier"])
	}
	// The pinned limiter keeps counting after the scrape: the veth's own
	// link-local traffic (IPv6 router solicitations, MLD reports) may add a
	// few unselected packets before status reads the maps; never fewer.
	if u, mu := float64(st.Unselected), m["tierlimit_unselected_packets_total"]; u < mu || u > mu+10 {
		t.Errorf("status unselected %d, metrics %v (status may only be a few packets later)", st.Unselected, mu)
	}
	var total uint64
	for _, s := range st.Selected {
		key := fmt.Sprintf("tierlimit_selected_packets_total{tier=%d,verdict=%s}", s.Tier, s.Verdict)
		if float64(s.Packets) != m[key] {
			t.Errorf("status %s = %d, metrics %v", key, s.Packets, m[key])
		}
		total += s.Packets
	}
	if total != 300 {
		t.Errorf("status counts %d selected packets, want the 300 sent", total)
	}
	text := run("status")
	for _, want := range []string{p.CollIf, "native XDP", "max 100 packets", fmt.Sprintf("n=%d", st.Window.Packets)} {
		if !strings.Contains(text, want) {
			t.Errorf("status text lacks %q:\n%s", want, text)
		}
	}

	run("detach", "--iface", p.CollIf)
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("pins left after detach: %v", err)
	}
	out, err := p.Coll.Command(context.Background(), "ip", "link", "show", p.CollIf).CombinedOutput()
	if err != nil || strings.Contains(string(out), "xdp") {
		t.Errorf("XDP still on %s after detach: %s %v", p.CollIf, out, err)
	}
}

// TestReloadOnSymlinkSwap: a config that is a symlink swapped to a new
// target (as Kubernetes updates a mounted ConfigMap) reloads once, and an
// event that leaves the content unchanged does not reload.
func TestReloadOnSymlinkSwap(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	dir := t.TempDir()
	for name, body := range map[string]string{"a.yaml": strictYAML, "b.yaml": lenientYAML} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "tierlimit.yaml")
	if err := os.Symlink("a.yaml", cfg); err != nil {
		t.Fatal(err)
	}
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--no-pin")
	// Unrelated churn in the directory: no reload.
	if err := os.WriteFile(filepath.Join(dir, "unrelated"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if strings.Contains(a.log.String(), "msg=reloaded") {
		t.Fatalf("reloaded on an unrelated file:\n%s", a.log)
	}
	// Swap the symlink atomically, as kubelet does.
	tmp := filepath.Join(dir, "tierlimit.yaml.tmp")
	if err := os.Symlink("b.yaml", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, cfg); err != nil {
		t.Fatal(err)
	}
	if !a.waitLog("max=1000000", 5*time.Second) {
		t.Fatalf("no reload after the symlink swap:\n%s", a.log)
	}
	if n := strings.Count(a.log.String(), "msg=reloaded"); n != 1 {
		t.Fatalf("%d reloads after one swap:\n%s", n, a.log)
	}
	if got := sum(scrape(t, p.Coll), "tierlimit_policy_max_packets"); got != 1_000_000 {
		t.Fatalf("policy_max_packets %v after the swap, want 1000000", got)
	}
}
