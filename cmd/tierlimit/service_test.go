package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

const unitFile = "../../deploy/systemd/tierlimit.service"

// unitSettings reads the [Service] settings of the packaged systemd unit:
// key -> values (a key may repeat).
func unitSettings(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			if k, v, ok := strings.Cut(line, "="); ok {
				out[k] = append(out[k], v)
			}
		}
	}
	return out
}

// documented fails the test when file (a page of the docs, by its path
// from this package) does not say each of words (any run of spaces and
// line breaks matching one space), so that a value a test holds as "the
// README's" stays where the reader finds it.
func documented(t *testing.T, file string, words ...string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(data)), " ")
	for _, w := range words {
		if !strings.Contains(text, w) {
			t.Errorf("%s does not say %q", file, w)
		}
	}
}

// setprivCaps turns "CAP_NET_ADMIN CAP_BPF" into setpriv's "-all,+net_admin,+bpf".
func setprivCaps(caps []string) string {
	s := "-all"
	for _, c := range caps {
		s += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	return s
}

// TestServiceUnitCapabilities runs `tierlimit run` as the packaged unit
// does: uid 0 with exactly the unit's capability bounding set, ambient
// set and no_new_privs (setpriv). It must attach and report healthy; with
// one capability fewer it must refuse to start, naming the capability. The
// unit's writable paths must cover the pin path and the lock directory.
func TestServiceUnitCapabilities(t *testing.T) {
	u := unitSettings(t)
	caps := strings.Fields(strings.Join(u["CapabilityBoundingSet"], " "))
	if got, want := strings.Join(caps, " "), "CAP_NET_ADMIN CAP_BPF CAP_PERFMON"; got != want {
		t.Errorf("CapabilityBoundingSet %q, want the README's %q", got, want)
	}
	documented(t, "../../README.md", caps...)
	documented(t, "../../docs/operations.md", "exactly CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON")
	if amb := strings.Join(u["AmbientCapabilities"], " "); amb != strings.Join(caps, " ") {
		t.Errorf("AmbientCapabilities %q, want the bounding set", amb)
	}
	rw := strings.Fields(strings.Join(u["ReadWritePaths"], " "))
	for _, p := range []string{filepath.Dir(agent.DefaultPinPath), pin.LockDir} {
		if !strings.Contains(" "+strings.Join(rw, " ")+" ", " "+p+" ") {
			t.Errorf("ReadWritePaths %v lacks %s", rw, p)
		}
	}
	if u["NoNewPrivileges"][0] != "yes" || u["ExecReload"][0] != "/bin/kill -HUP $MAINPID" || u["Restart"][0] != "on-failure" {
		t.Errorf("NoNewPrivileges %v, ExecReload %v, Restart %v", u["NoNewPrivileges"], u["ExecReload"], u["Restart"])
	}

	testenv.Require(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatal("setpriv (util-linux) not installed")
	}
	p := testenv.NewPair(t)
	pinPath := testPin(t, p)
	setpriv := func(caps []string) []string {
		c := setprivCaps(caps)
		return []string{"--no-new-privs", "--bounding-set=" + c, "--inh-caps=" + c, "--ambient-caps=" + c, "--", cli(t), "run", "--iface", p.CollIf, "--pin-path", pinPath}
	}

	// One capability fewer: refused before anything is attached.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := p.Coll.Command(ctx, "setpriv", setpriv(caps[:2])...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "CAP_PERFMON") {
		t.Errorf("without CAP_PERFMON: %v, %s; want a refusal naming CAP_PERFMON", err, out)
	}

	a := &agentProc{log: &testenv.SyncBuffer{}, done: make(chan struct{})}
	a.cmd = p.Coll.Command(context.Background(), "setpriv", setpriv(caps)...)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() { a.cmd.Process.Kill(); <-a.done })
	if !a.waitLog("msg=started", 15*time.Second) {
		t.Fatalf("run with the unit's capabilities did not start:\n%s", a.log)
	}
	if status, body, err := testenv.Get(p.Coll, "http://127.0.0.1:9713/healthz"); err != nil || status != 200 {
		t.Fatalf("/healthz: %d %s %v", status, body, err)
	}
	if m := testenv.XDP(t, p.Coll, p.CollIf).Mode; m == "" {
		t.Fatalf("not attached with the unit's capabilities:\n%s", a.log)
	}
}

// TestServiceUnitExecStart runs the unit's ExecStart command line as
// systemd would hand it to /bin/sh ($$ is a literal $), with echo in place
// of the binary: one --iface per name of TIERLIMIT_IFACES, then the options.
func TestServiceUnitExecStart(t *testing.T) {
	u := unitSettings(t)
	line := u["ExecStart"][0]
	const prefix = "/bin/sh -c '"
	if !strings.HasPrefix(line, prefix) || !strings.HasSuffix(line, "'") {
		t.Fatalf("ExecStart %q: want /bin/sh -c '...'", line)
	}
	script := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(line, prefix), "'"), "$$", "$")
	if !strings.Contains(script, "exec /usr/bin/tierlimit run") {
		t.Fatalf("ExecStart script %q does not exec /usr/bin/tierlimit run", script)
	}
	script = strings.Replace(script, "exec /usr/bin/tierlimit", "exec echo", 1)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"TIERLIMIT_IFACES=eth1  eth2*", "TIERLIMIT_CONFIG=/etc/tierlimit/policy.yaml", "TIERLIMIT_OPTS=--mode dry-run"}
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(out)), "run --config /etc/tierlimit/policy.yaml --iface eth1 --iface eth2* --mode dry-run"; got != want {
		t.Errorf("ExecStart runs %q, want %q", got, want)
	}
}
