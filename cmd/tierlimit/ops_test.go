package main

// Operations tests (issue 11 part B and D, issue 16 item 2): ordinary
// events of an operator's day must neither kill nor wedge the agent. They
// run the real binary in the collector namespace (lifecycle_test.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// waitFor polls cond every 20 ms for at most limit.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// exitCodeOf returns the exit code of an exited agent, or -1 with the
// signal that killed it.
func (p *agentProc) exitStatus() string {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ok && ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit %d", p.cmd.ProcessState.ExitCode())
}

// TestHUPDuringStartup (issue 11 case 5): a SIGHUP 50 ms after the agent
// starts, while it loads and attaches, neither kills it nor is lost: the
// agent reloads once it is ready, and stops cleanly.
//
// No program can handle a signal before its runtime has started; on a
// loaded machine that takes longer than 50 ms. So the HUP goes 50 ms after
// the start or as soon as the program's package initialisation has begun
// (GODEBUG=inittrace shows it), whichever is later: either way long before
// the agent is ready.
func TestHUPDuringStartup(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	cfg := writeFile(t, "policy.yaml", runPolicy)
	start := time.Now()
	a := spawnRun(t, p.Coll, func(c *exec.Cmd) { c.Env = append(c.Env, "GODEBUG=inittrace=1") },
		"--iface", p.CollIf, "--config", cfg, "--no-pin")
	if !a.waitLog("init github.com/tierlimit/tierlimit/internal/earlysignal @", 10*time.Second) {
		t.Fatalf("no SIGHUP subscription while the program initialises:\n%s", a.log)
	}
	time.Sleep(time.Until(start.Add(50 * time.Millisecond)))
	a.signal(t, syscall.SIGHUP)
	early := !strings.Contains(a.log.String(), "msg=started")
	if !a.waitLog("msg=started", 15*time.Second) {
		if !a.alive() {
			t.Fatalf("agent died of a SIGHUP during startup (%s):\n%s", a.exitStatus(), a.log)
		}
		t.Fatalf("agent did not start:\n%s", a.log)
	}
	if !early {
		t.Fatalf("the agent was ready before the SIGHUP: the test proves nothing\n%s", a.log)
	}
	if !a.waitLog("trigger=SIGHUP", 5*time.Second) {
		t.Fatalf("the early SIGHUP was lost:\n%s", a.log)
	}
	a.stop(t, syscall.SIGTERM)
	if code := a.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s after SIGTERM:\n%s", a.exitStatus(), a.log)
	}
}

// TestClosedStderr (issue 11 case 6): the agent logs into a FIFO whose
// reader dies (journald restarting does the same to a service); SIGHUPs
// then make it log into the broken pipe. With --no-pin, dying would remove
// the limiter: it must stay alive, healthy and limiting.
func TestClosedStderr(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	cfg := writeFile(t, "policy.yaml", strictYAML)
	fifo := filepath.Join(t.TempDir(), "stderr")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	reader := exec.Command("cat", fifo)
	reader.Stdout = &logs
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { reader.Process.Kill(); reader.Wait() }()
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0) // waits for cat to open it
	if err != nil {
		t.Fatal(err)
	}
	a := spawnRun(t, p.Coll, func(c *exec.Cmd) { c.Stderr = w }, "--iface", p.CollIf, "--config", cfg, "--no-pin")
	w.Close()
	if !waitFor(15*time.Second, func() bool { return strings.Contains(logs.String(), "msg=started") }) {
		t.Fatalf("agent did not start:\n%s", logs.String())
	}
	time.Sleep(300 * time.Millisecond) // past startup (TestHUPDuringStartup is that case)
	reader.Process.Kill()
	reader.Wait()
	for range 3 {
		a.signal(t, syscall.SIGHUP)
		time.Sleep(300 * time.Millisecond)
		if !a.alive() {
			t.Fatalf("agent died logging into a closed stderr: %s", a.exitStatus())
		}
	}
	if status, body, err := testenv.Get(p.Coll, "http://127.0.0.1:9713/healthz"); err != nil || status != 200 {
		t.Fatalf("/healthz: %d %s %v", status, body, err)
	}
	f := startFlood(t, p, 3*time.Second)
	defer f.stop()
	prev := scrape(t, p.Coll)
	time.Sleep(300 * time.Millisecond)
	perWindow, share := passRate(t, p.Coll, &prev)
	checkFollows(t, "after stderr closed", true, perWindow, share)
}

// TestConfigNotRegular (issue 11 case 7): check and run refuse a FIFO (on
// which a plain read blocks for ever), a directory and a file over the
// size limit, at once, with exit code 2 and the reason. No root needed:
// run fails before it looks at the (absent) interface.
func TestConfigNotRegular(t *testing.T) {
	bin := cli(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.yaml")
	if err := os.WriteFile(huge, bytes.Repeat([]byte("#"), tiers.MaxConfigBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{fifo, "not a regular file (a FIFO)"},
		{dir, "not a regular file (a directory)"},
		{huge, "the limit is 4194304 bytes (4 MiB)"},
	} {
		for _, args := range [][]string{
			{"check", "--config", c.path},
			{"run", "--iface", "tl-absent0", "--no-pin", "--metrics-addr", "", "--config", c.path},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			timedOut := ctx.Err() != nil
			cancel()
			var ee *exec.ExitError
			if timedOut || !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), c.want) {
				t.Errorf("%q: timed out %v, %v, want exit 2 naming %q:\n%s", args, timedOut, err, c.want, out)
			}
		}
	}
}

// TestReloadRefusesFIFO (issue 11 case 7): the config replaced by a FIFO
// while the agent runs: the reload is refused without blocking, a SIGHUP
// too, and SIGTERM still stops the agent.
func TestReloadRefusesFIFO(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	cfg := writeFile(t, "policy.yaml", runPolicy)
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--no-pin")
	tmp := cfg + ".fifo"
	if err := syscall.Mkfifo(tmp, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, cfg); err != nil {
		t.Fatal(err)
	}
	if !a.waitLog("not a regular file", 5*time.Second) {
		t.Fatalf("no refused reload for a FIFO:\n%s", a.log)
	}
	a.signal(t, syscall.SIGHUP)
	if !waitFor(5*time.Second, func() bool { return strings.Count(a.log.String(), "not a regular file") == 2 }) {
		t.Fatalf("SIGHUP on a FIFO config not refused:\n%s", a.log)
	}
	a.stop(t, syscall.SIGTERM)
}

// fdCount is the number of open file descriptors of pid.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// TestIdleMetricsConns (issue 11 case 8): the agent runs with a hard limit
// of 200 open files (as a small service limit would be) and gets 5 × the
// cap of idle connections to its metrics port, more than that limit: it
// holds at most agent.MaxMetricsConns of them, /healthz answers, and file
// and SIGHUP reloads still get the fds they need.
func TestIdleMetricsConns(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	cfg := writeFile(t, "policy.yaml", runPolicy)
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) not installed")
	}
	const nofile = 200
	a := spawnRun(t, p.Coll, func(c *exec.Cmd) {
		// prlimit and nsenter both exec: the pid stays the agent's.
		c.Args = append([]string{prlimit, fmt.Sprintf("--nofile=%d", nofile), "--"}, c.Args...)
		c.Path = prlimit
	}, "--iface", p.CollIf, "--config", cfg, "--no-pin")
	if !a.waitLog("serving metrics", 15*time.Second) {
		t.Fatalf("no metrics server:\n%s", a.log)
	}
	base := fdCount(t, a.cmd.Process.Pid)
	const idle = 5 * agent.MaxMetricsConns
	if idle <= nofile {
		t.Fatalf("%d idle connections do not exceed the limit of %d fds", idle, nofile)
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	err = p.Coll.Do(func() error {
		for range idle {
			c, err := net.DialTimeout("tcp", "127.0.0.1:9713", 5*time.Second)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	// /healthz queues behind every idle connection: once it answers, the
	// agent has accepted them all.
	if status, body, err := testenv.Get(p.Coll, "http://127.0.0.1:9713/healthz"); err != nil || status != 200 {
		t.Fatalf("/healthz under %d idle connections: %d %s %v", idle, status, body, err)
	}
	if n := fdCount(t, a.cmd.Process.Pid); n > base+agent.MaxMetricsConns+4 {
		t.Fatalf("agent holds %d fds with %d idle connections (%d before): not capped at %d connections",
			n, idle, base, agent.MaxMetricsConns)
	}
	writeConfig(t, cfg, strictYAML)
	if !a.waitLog("max=100 ", 5*time.Second) {
		t.Fatalf("no reload under idle connections:\n%s", a.log)
	}
	a.signal(t, syscall.SIGHUP)
	if !a.waitLog("trigger=SIGHUP", 5*time.Second) {
		t.Fatalf("no SIGHUP reload under idle connections:\n%s", a.log)
	}
}

// TestConfigDeletedWhileLogging (issue 11 case 9): the agent logs into a
// file next to its config, and the config is deleted: one error, one
// counted failure, then silence, although every log line is an event in
// the watched directory; the file's return reloads.
func TestConfigDeletedWhileLogging(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "policy.yaml")
	writeConfig(t, cfg, runPolicy)
	logPath := filepath.Join(dir, "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	a := spawnRun(t, p.Coll, func(c *exec.Cmd) { c.Stderr = logf }, "--iface", p.CollIf, "--config", cfg, "--no-pin")
	logged := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	if !waitFor(15*time.Second, func() bool { return strings.Contains(logged(), "msg=started") }) {
		t.Fatalf("agent did not start:\n%s", logged())
	}
	if err := os.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if n := strings.Count(logged(), "level=ERROR"); n != 1 {
		t.Fatalf("%d errors in 3 s for one deleted config, want 1:\n%s", n, logged())
	}
	if got := sum(scrape(t, p.Coll), "tierlimit_config_reloads_total", "result=error"); got != 1 {
		t.Fatalf("config_reloads_total{error} = %v, want 1", got)
	}
	writeConfig(t, cfg, strictYAML)
	if !waitFor(5*time.Second, func() bool { return strings.Contains(logged(), "max=100 ") }) {
		t.Fatalf("no reload when the config came back:\n%s", logged())
	}
	if !a.alive() {
		t.Fatalf("agent exited: %s", a.exitStatus())
	}
}

// TestReloadConfigMapBehindSymlink (issue 16 item 2): --config is a symlink
// into another directory that holds a Kubernetes ConfigMap mount
// (policy.yaml -> ..data/policy.yaml, ..data -> a timestamped directory).
// An edit of the final file in place, a ..data swap and a SIGHUP each
// reload once; an edit of the ConfigMap's old directory does not.
func TestReloadConfigMapBehindSymlink(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	root := t.TempDir()
	cm, etc := filepath.Join(root, "cm"), filepath.Join(root, "etc")
	for _, d := range []string{filepath.Join(cm, "..v1"), filepath.Join(cm, "..v2"), etc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(cm, "..v1", "policy.yaml"), []byte(lenientYAML), 0o644))
	must(os.Symlink("..v1", filepath.Join(cm, "..data")))
	must(os.Symlink("..data/policy.yaml", filepath.Join(cm, "policy.yaml")))
	cfg := filepath.Join(etc, "policy.yaml")
	must(os.Symlink("../cm/policy.yaml", cfg))
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--no-pin")

	// In place, through two symlinks, in a third directory.
	must(os.WriteFile(filepath.Join(cm, "..v1", "policy.yaml"), []byte(strictYAML), 0o644))
	if !a.waitLog("max=100 ", 5*time.Second) {
		t.Fatalf("no reload after an edit in place:\n%s", a.log)
	}
	// kubelet's swap: new directory, new ..data renamed over the old.
	must(os.WriteFile(filepath.Join(cm, "..v2", "policy.yaml"), []byte(strings.Replace(strictYAML, "max: 100", "max: 200", 1)), 0o644))
	must(os.Symlink("..v2", filepath.Join(cm, "..data_tmp")))
	must(os.Rename(filepath.Join(cm, "..data_tmp"), filepath.Join(cm, "..data")))
	if !a.waitLog("max=200 ", 5*time.Second) {
		t.Fatalf("no reload after a ..data swap:\n%s", a.log)
	}
	must(os.WriteFile(filepath.Join(cm, "..v1", "policy.yaml"), []byte(lenientYAML), 0o644))
	a.signal(t, syscall.SIGHUP)
	if !a.waitLog("trigger=SIGHUP", 5*time.Second) {
		t.Fatalf("no SIGHUP reload:\n%s", a.log)
	}
	time.Sleep(500 * time.Millisecond)
	if n := strings.Count(a.log.String(), "msg=reloaded"); n != 3 {
		t.Fatalf("%d reloads, want 3 (edit, swap, SIGHUP):\n%s", n, a.log)
	}
	if got := sum(scrape(t, p.Coll), "tierlimit_policy_max_packets"); got != 200 {
		t.Fatalf("policy_max_packets %v, want 200 (the old ..v1 is no longer the config)", got)
	}
}

// TestCleanShutdown (issue 11 D): 20 start/stop cycles of run log no
// error (the metrics listener closing at shutdown was one, 1 in 30).
func TestCleanShutdown(t *testing.T) {
	testenv.Require(t)
	p := runPair(t)
	cfg := writeFile(t, "policy.yaml", runPolicy)
	for i := range 20 {
		r, _ := startCLI(t, p.Coll, "run", "--iface", p.CollIf, "--config", cfg, "--no-pin")
		if err := r.stop(t); err != nil {
			t.Fatalf("cycle %d: %v\n%s", i, err, r.log)
		}
		if strings.Contains(r.log.String(), "level=ERROR") {
			t.Fatalf("cycle %d logged an error:\n%s", i, r.log)
		}
	}
}
