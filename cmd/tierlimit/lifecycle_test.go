package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// The lifecycle tests (docs/design.md §2 Reload, Restart; §4 status, detach) run
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
	// The episode state file (docs/design.md §10) goes to the test's dir.
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
	out, err := metricValues(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
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
	pinPath := testenv.PinPath(t, pin.LockFile)
	t.Cleanup(func() {
		p.Coll.Command(context.Background(), cli(t), "detach", "--iface", p.CollIf, "--pin-path", pinPath).Run()
	})
	return pinPath
}

// pinnedSetup makes a namespace pair, a pin path and a config file holding
// body, for tests that run a pinned agent.
func pinnedSetup(t *testing.T, body string) (p *testenv.Pair, pinPath, cfg string) {
	t.Helper()
	p = testenv.NewPair(t)
	pinPath = testPin(t, p)
	cfg = filepath.Join(t.TempDir(), "tierlimit.yaml")
	writeConfig(t, cfg, body)
	return p, pinPath, cfg
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
