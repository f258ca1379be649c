package main

// Acceptance tests of `tierlimit run` (issue 4): attach modes on a veth,
// driven through run() as a function inside the collector namespace, and
// the one-line failure messages. The BPF ones need root (testenv.Require)
// and work only on interfaces they create, in namespaces they create.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// runPolicy is a small policy: max 2000 per 1 s window, UDP 514 only.
const runPolicy = `max: 2000
tiers: [{at: 70%, drop: 20%}, {at: 80%, drop: 50%}, {at: 100%, drop: 100%}]
select: [{proto: udp, ports: [514]}]
`

// leftovers registers, before the namespaces exist, a cleanup that runs
// after they are removed and checks that none of them is listed by `ip
// netns list` and no veth end by the host's `ip -o link show type veth`.
func leftovers(t *testing.T, names func() []string) {
	t.Helper()
	t.Cleanup(func() {
		netnsList, _ := exec.Command("ip", "netns", "list").CombinedOutput()
		veths, _ := exec.Command("ip", "-o", "link", "show", "type", "veth").CombinedOutput()
		for _, n := range names() {
			if strings.Contains(string(netnsList), n) || strings.Contains(string(veths), n) {
				t.Errorf("%s left behind", n)
			}
		}
	})
}

// runPair makes a namespace pair whose leftovers are checked at the end.
func runPair(t *testing.T) *testenv.Pair {
	t.Helper()
	var p *testenv.Pair
	leftovers(t, func() []string {
		if p == nil {
			return nil
		}
		return []string{p.Coll.Name, p.Send.Name, p.CollIf, p.SendIf}
	})
	p = testenv.NewPair(t)
	return p
}

// newNS makes a namespace whose removal is checked at the end.
func newNS(t *testing.T) *testenv.NS {
	t.Helper()
	var ns *testenv.NS
	leftovers(t, func() []string {
		if ns == nil {
			return nil
		}
		return []string{ns.Name}
	})
	ns = testenv.NewNS(t)
	return ns
}

// runningCLI is run() executing in a goroutine inside a namespace.
type runningCLI struct {
	cancel context.CancelFunc
	errc   chan error
	log    *testenv.SyncBuffer
	err    error
	done   bool
}

// startCLI calls run(ctx, args) on a thread inside ns, as `nsenter --net`
// would run the binary, and waits (bounded) for the metrics listener. Its
// cleanup stops run before the namespace goes.
func startCLI(t *testing.T, ns *testenv.NS, args ...string) (*runningCLI, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningCLI{cancel: cancel, errc: make(chan error, 1), log: &testenv.SyncBuffer{}}
	go func() {
		r.errc <- ns.Do(func() error { return run(ctx, args, io.Discard, r.log) })
	}()
	t.Cleanup(func() { r.stop(t) })
	re := regexp.MustCompile(`msg="serving metrics" addr=http://([0-9.:]+)/metrics`)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := re.FindStringSubmatch(r.log.String()); m != nil {
			return r, m[1]
		}
		select {
		case err := <-r.errc:
			r.done, r.err = true, err
			t.Fatalf("run %q returned early: %v\n%s", args, err, r.log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %q: no metrics listener within 15s:\n%s", args, r.log)
		}
	}
}

// stop cancels run's context (as SIGINT would) and returns its error.
func (r *runningCLI) stop(t *testing.T) error {
	t.Helper()
	if r.done {
		return r.err
	}
	r.cancel()
	select {
	case r.err = <-r.errc:
		r.done = true
	case <-time.After(15 * time.Second):
		t.Fatalf("run did not return within 15s of cancel:\n%s", r.log)
	}
	return r.err
}

// TestRunAttachModes runs `tierlimit run --xdp-mode M` on a veth for each
// mode and checks the kernel's attach mode, the log lines,
// tierlimit_xdp_attached{iface,mode} on /metrics, /healthz, and that stopping
// (the context, as SIGINT/SIGTERM do) detaches.
func TestRunAttachModes(t *testing.T) {
	testenv.Require(t)
	p := runPair(t)
	cfg := writeFile(t, "policy.yaml", runPolicy)
	for _, c := range []struct{ flag, want string }{
		{"native", "native"},
		{"generic", "generic"},
		{"auto", "native"}, // veth has native XDP: auto must not fall back
	} {
		t.Run(c.flag, func(t *testing.T) {
			r, addr := startCLI(t, p.Coll, "run", "--iface", p.CollIf, "--xdp-mode", c.flag, "--config", cfg,
				"--no-pin", "--metrics-addr", "127.0.0.1:0")
			if got := testenv.XDP(t, p.Coll, p.CollIf).Mode; got != c.want {
				t.Errorf("kernel reports %q, want %q", got, c.want)
			}
			// The listener was made on run's thread, inside the namespace.
			status, body, err := testenv.Get(p.Coll, "http://"+addr+"/metrics")
			line := fmt.Sprintf("tierlimit_xdp_attached{iface=%q,mode=%q} 1\n", p.CollIf, c.want)
			if err != nil || status != 200 || !strings.Contains(string(body), line) {
				t.Errorf("/metrics: %d, %v; want the line %q in:\n%.2000s", status, err, line, body)
			}
			if !strings.Contains(string(body), "tierlimit_policy_max_packets 2000\n") {
				t.Errorf("/metrics does not show the config's max 2000")
			}
			if status, _, err := testenv.Get(p.Coll, "http://"+addr+"/healthz"); err != nil || status != 200 {
				t.Errorf("/healthz: %d, %v; want 200", status, err)
			}
			log := r.log.String()
			for _, want := range []string{
				"msg=attached iface=" + p.CollIf, "mode=" + c.want,
				"msg=started interfaces=" + p.CollIf + "(" + c.want + ")", "config=" + cfg,
			} {
				if !strings.Contains(log, want) {
					t.Errorf("log lacks %q:\n%s", want, log)
				}
			}
			if strings.Contains(log, "falling back") {
				t.Errorf("%s mode fell back:\n%s", c.flag, log)
			}

			if err := r.stop(t); err != nil {
				t.Errorf("run returned %v after cancel, want nil", err)
			}
			if got := testenv.XDP(t, p.Coll, p.CollIf).Mode; got != "" {
				t.Errorf("after run stopped, %s still has XDP (%s) despite --no-pin", p.CollIf, got)
			}
			for _, want := range []string{"msg=stopping", "msg=detached iface=" + p.CollIf, "msg=stopped"} {
				if !strings.Contains(r.log.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, r.log)
				}
			}
		})
	}
}

// bridgeNS makes a namespace holding a bridge, which has no native XDP (no
// ndo_bpf): the kernel refuses XDP_FLAGS_DRV_MODE. A bridge rather than a
// dummy, since the dummy driver is a module that kernels may lack.
func bridgeNS(t *testing.T, name string) *testenv.NS {
	t.Helper()
	ns := newNS(t)
	if err := ns.Do(func() error {
		d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(d); err != nil {
			return err
		}
		return netlink.LinkSetUp(d)
	}); err != nil {
		t.Fatalf("bridge %s in %s: %v", name, ns.Name, err)
	}
	return ns
}

// oneLine checks that stderr, as main prints it, is exactly one line
// holding every one of want.
func oneLine(t *testing.T, stderr string, want ...string) {
	t.Helper()
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") || !strings.HasPrefix(stderr, "tierlimit: ") {
		t.Errorf("stderr is not one 'tierlimit: ...' line: %q", stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr %q lacks %q", stderr, w)
		}
	}
}

// TestRunXDPRefused asks for native XDP on an interface whose driver has
// none: one line with the kernel's reason, exit 1, nothing attached. auto
// falls back to generic on the same interface and logs why.
func TestRunXDPRefused(t *testing.T) {
	testenv.Require(t)
	const brIf = "tlbridge0"
	ns := bridgeNS(t, brIf)

	var stdout, stderr bytes.Buffer
	err := ns.Do(func() error {
		return run(context.Background(), []string{"run", "--iface", brIf, "--xdp-mode", "native", "--no-pin", "--metrics-addr", ""}, &stdout, &stderr)
	})
	if err == nil {
		t.Fatal("run attached native XDP to a bridge")
	}
	var line bytes.Buffer // what main prints after run's logs
	if code := report(&line, err); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	t.Logf("native on a bridge: %s", strings.TrimSpace(line.String()))
	oneLine(t, line.String(), "attach xdp to "+brIf, "native", "not supported")
	if got := testenv.XDP(t, ns, brIf).Mode; got != "" {
		t.Errorf("a failed run left XDP (%s) on %s", got, brIf)
	}

	r, _ := startCLI(t, ns, "run", "--iface", brIf, "--xdp-mode", "auto", "--no-pin", "--metrics-addr", "127.0.0.1:0")
	if got := testenv.XDP(t, ns, brIf).Mode; got != "generic" {
		t.Errorf("auto on a bridge: kernel reports %q, want generic", got)
	}
	if log := r.log.String(); !strings.Contains(log, `msg="native XDP refused, falling back to generic" iface=`+brIf+" reason=") {
		t.Errorf("auto did not log why it fell back:\n%s", log)
	}
	if err := r.stop(t); err != nil {
		t.Errorf("run: %v", err)
	}
	if got := testenv.XDP(t, ns, brIf).Mode; got != "" {
		t.Errorf("after run stopped, %s still has XDP (%s)", brIf, got)
	}
}

// TestRunMissingInterface drives run() as a function in an empty namespace:
// one line naming the interface, exit 1.
func TestRunMissingInterface(t *testing.T) {
	testenv.Require(t)
	ns := newNS(t)
	var stdout, stderr bytes.Buffer
	err := ns.Do(func() error {
		return run(context.Background(), []string{"run", "--iface", "tlnone0", "--no-pin", "--metrics-addr", ""}, &stdout, &stderr)
	})
	if !errors.Is(err, pin.ErrNoInterface) {
		t.Fatalf("run: %v, want ErrNoInterface", err)
	}
	if stderr.Len() != 0 {
		t.Errorf("run logged before failing: %q", stderr.String())
	}
	if code := report(&stderr, err); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	t.Logf("missing interface: %s", strings.TrimSpace(stderr.String()))
	oneLine(t, stderr.String(), `"tlnone0"`, "no such interface")
	if stdout.Len() != 0 {
		t.Errorf("stdout %q, want nothing", stdout.String())
	}
}

// TestRunBadConfig: config errors exit 2 with one line, before anything
// touches the kernel (so no root is needed); usage errors exit 2 too.
func TestRunBadConfig(t *testing.T) {
	order := writeFile(t, "order.yaml", "max: 2000\ntiers:\n  - {at: 80%, drop: 20%}\n  - {at: 70%, drop: 50%}\n")
	unknown := writeFile(t, "unknown.yaml", "max: 2000\nmaximum: 3\n")
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"tiers out of order", []string{"--config", order}, []string{order, "line 4", "tiers[1].at", "out of order"}},
		{"unknown key", []string{"--config", unknown}, []string{unknown, "line 2", "maximum"}},
		{"missing file", []string{"--config", "/nonexistent/tierlimit.yaml"}, []string{"/nonexistent/tierlimit.yaml"}},
		{"bad mode", []string{"--mode", "bogus"}, []string{"--mode", "bogus"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// tlnone0 exists nowhere: even a broken config check could
			// attach to nothing.
			args := append([]string{"run", "--iface", "tlnone0", "--no-pin", "--metrics-addr", ""}, c.args...)
			err := run(context.Background(), args, &stdout, &stderr)
			if errors.Is(err, pin.ErrNoInterface) || errors.Is(err, agent.ErrNotRoot) {
				t.Fatalf("run got past the config check: %v", err)
			}
			code := report(&stderr, err)
			if code != 2 {
				t.Errorf("exit %d, want 2 (err %v)", code, err)
			}
			t.Logf("%s: %s", c.name, strings.TrimSpace(stderr.String()))
			first, _, _ := strings.Cut(stderr.String(), "\n")
			oneLine(t, first+"\n", c.want...)
			// A usage error may add the --help hint, and nothing else.
			if rest := strings.TrimPrefix(stderr.String(), first+"\n"); rest != "" && rest != "Run 'tierlimit --help' for usage.\n" {
				t.Errorf("stderr has more than the error line: %q", stderr.String())
			}
		})
	}
	// No --iface: a usage error.
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"run", "--no-pin"}, io.Discard, &stderr)
	if code := report(&stderr, err); code != 2 || !strings.Contains(stderr.String(), "--iface") {
		t.Errorf("run without --iface: exit %d, stderr %q; want 2 naming --iface", code, stderr.String())
	}
}

// TestRunNotRoot runs the built binary as nobody (setpriv), in an empty
// namespace: one line saying it needs root, exit 1. Without root the test
// drives run() directly, which must say the same.
func TestRunNotRoot(t *testing.T) {
	args := []string{"run", "--iface", "tlnone0"}
	if os.Geteuid() != 0 {
		var stderr bytes.Buffer
		err := run(context.Background(), args, io.Discard, &stderr)
		if code := report(&stderr, err); code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		oneLine(t, stderr.String(), "needs root")
		return
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	ns := newNS(t)
	// A directory nobody can enter: t.TempDir's parent is 0700.
	dir, err := os.MkdirTemp("", "tltest-notroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "tierlimit")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := ns.Command(ctx, "setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--", bin}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("as nobody: %v, want exit status 1", err)
	}
	t.Logf("as nobody: %s", strings.TrimSpace(stderr.String()))
	oneLine(t, stderr.String(), "needs root")
	if stdout.Len() != 0 {
		t.Errorf("stdout %q, want nothing", stdout.String())
	}
}

// TestRunMetricsAddrFailsFirst: a bad --metrics-addr (exit 2) or a busy one
// (exit 1) fails before anything is attached.
func TestRunMetricsAddrFailsFirst(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	var busy net.Listener
	if err := p.Coll.Do(func() (err error) { busy, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// With --no-pin there is no pin path: nothing may create a lock file
	// for the empty one (issue 11 D: "..lock").
	noPinLock := pin.LockFile("")
	os.Remove(noPinLock)
	defer func() {
		if _, err := os.Stat(noPinLock); err == nil {
			t.Errorf("a --no-pin run created the lock file %s", noPinLock)
			os.Remove(noPinLock)
		}
	}()
	for _, c := range []struct {
		addr string
		code int
		want string
	}{{"bogus", exitUsage, "--metrics-addr"}, {busy.Addr().String(), exitFailure, "address already in use"}} {
		// With --no-pin there is no pin path: no lock file may appear
		// (it used to be /run/tierlimit/..lock).
		dotLock := pin.LockDir + "/..lock"
		os.Remove(dotLock)
		defer func() {
			if _, err := os.Stat(dotLock); err == nil {
				t.Errorf("--no-pin --metrics-addr %s made %s", c.addr, dotLock)
			}
		}()
		var stderr bytes.Buffer
		err := p.Coll.Do(func() error {
			return run(context.Background(), []string{"run", "--iface", p.CollIf, "--no-pin", "--metrics-addr", c.addr}, io.Discard, &stderr)
		})
		if code := exitCode(err); code != c.code || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--metrics-addr %s: exit %d (%v), want %d mentioning %q", c.addr, code, err, c.code, c.want)
		}
		if m := testenv.XDP(t, p.Coll, p.CollIf).Mode; m != "" {
			t.Errorf("--metrics-addr %s: the limiter was attached (%s) before the listener failed", c.addr, m)
		}
	}
}
