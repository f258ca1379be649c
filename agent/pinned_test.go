package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// startPinned starts an agent on the pair's collector veth, pinned under pin.
func startPinned(t *testing.T, p *testenv.Pair, pinPath string, policy tiers.Policy) *agent.Agent {
	t.Helper()
	a, err := newAgent(p, agent.Config{PinPath: pinPath}, policy)
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	return a
}

// sendUDP sends n syslog datagrams at once from the sender namespace to the
// collector's port.
func sendUDP(t *testing.T, p *testenv.Pair, port uint16, n int) {
	t.Helper()
	s := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, port))
	if _, err := s.Pace(context.Background(), n, 0, 5*time.Second, func(i int) []byte { return testenv.SyslogMessage(0, i) }); err != nil {
		t.Fatalf("send: %v", err)
	}
}

func defaultPolicy() tiers.Policy {
	p := tiers.Default()
	p.Max = 100
	return p
}

// TestRestartAdoptsPinnedState stops an agent, checks the limiter stays
// attached and counting, and starts another that adopts it: the program is
// replaced in place and the counters continue.
func TestRestartAdoptsPinnedState(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	t.Cleanup(func() { p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) }) })

	a := startPinned(t, p, pinPath, defaultPolicy())
	x := testenv.XDP(t, p.Coll, p.CollIf)
	id1, name := x.ID, x.Name
	if id1 == 0 || name != pin.ProgramName {
		t.Fatalf("after start: program %d %q attached, want %q", id1, name, pin.ProgramName)
	}
	sendUDP(t, p, 514, 10)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if id := testenv.XDP(t, p.Coll, p.CollIf).ID; id != id1 {
		t.Fatalf("after the agent stopped: program %d attached, want %d still", id, id1)
	}
	// The judgement's program array stays filled past the agent (pinned
	// beside the program): the program left attached tail-calls it.
	jump1 := pinnedJump(t, pinPath)
	if jump1 == 0 {
		t.Fatal("after the agent stopped: the pinned program_jump is empty")
	}
	sendUDP(t, p, 514, 10) // counted while no agent runs

	st, err := agent.ReadStatus(pinPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Stats.SelectedPackets(); got != 20 {
		t.Fatalf("status with no agent: %d selected packets, want 20", got)
	}

	a2 := startPinned(t, p, pinPath, defaultPolicy())
	defer a2.Close()
	id2 := testenv.XDP(t, p.Coll, p.CollIf).ID
	if id2 == 0 || id2 == id1 {
		t.Fatalf("after restart: program %d, want a new program replacing %d", id2, id1)
	}
	sendUDP(t, p, 514, 10)
	err = p.Coll.Do(func() (err error) { st, err = agent.ReadStatus(pinPath); return err })
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Stats.SelectedPackets(); got != 30 {
		t.Fatalf("after restart: %d selected packets, want 30 (counters continue)", got)
	}
	if len(st.Links) != 1 || st.Links[0].Iface != p.CollIf || st.Links[0].ProgramID != id2 || st.Links[0].Mode != "native" {
		t.Fatalf("status links %+v, want %s running program %d", st.Links, p.CollIf, id2)
	}
	if jump2 := pinnedJump(t, pinPath); jump2 == 0 || jump2 == jump1 {
		t.Fatalf("after restart: program_jump holds program %d, want the new judgement replacing %d", jump2, jump1)
	}
}

// TestRestartCarriesSketch: a restarted agent carries the source sketch
// of the program it replaces (docs/design.md §4, "Restart"; the sketch is
// the program's own, not pinned): 20 datagrams from one source with a
// budget of 15 put it 5 over; after the restart, in the same window, the
// next 10 are all over budget, where an empty sketch would pass them all.
func TestRestartCarriesSketch(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	t.Cleanup(func() { p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) }) })
	pol := defaultPolicy()
	pol.Window = time.Hour // one window for the whole test
	pol.Sources = tiers.Sources{BudgetPackets: 15, PrefixV4: 32, PrefixV6: 64}
	over := func() uint64 {
		t.Helper()
		var st agent.Status
		err := p.Coll.Do(func() (err error) { st, err = agent.ReadStatus(pinPath); return err })
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range st.Stats.OverBudget {
			n += c.Packets
		}
		return n
	}
	a := startPinned(t, p, pinPath, pol)
	sendUDP(t, p, 514, 20)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := over(); got != 5 {
		t.Fatalf("before the restart: %d datagrams over budget, want 5", got)
	}
	a2 := startPinned(t, p, pinPath, pol)
	defer a2.Close()
	sendUDP(t, p, 514, 10)
	if got := over(); got != 15 {
		t.Fatalf("after the restart: %d datagrams over budget, want 15 (the source's count carried over)", got)
	}
}

// pinnedJump is the id of the program in slot 0 of the program array
// pinned at <pin>/program_jump (0 when empty).
func pinnedJump(t *testing.T, pinPath string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, "program_jump"), nil)
	if err != nil {
		t.Fatalf("pinned program_jump: %v", err)
	}
	defer m.Close()
	var id uint32
	if err := m.Lookup(uint32(0), &id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("program_jump slot 0: %v", err)
	}
	return id
}

// TestDetachRemovesEverything: after detach no pinned file and no XDP remain.
func TestDetachRemovesEverything(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	a := startPinned(t, p, pinPath, defaultPolicy())
	a.Close()
	if err := p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) }); err != nil {
		t.Fatalf("detach: %v", err)
	}
	if id := testenv.XDP(t, p.Coll, p.CollIf).ID; id != 0 {
		t.Fatalf("program %d still attached after detach", id)
	}
	if _, err := os.Stat(pinPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pin dir %s still there after detach (err %v)", pinPath, err)
	}
	if _, err := agent.ReadStatus(pinPath); !errors.Is(err, pin.ErrNotPinned) {
		t.Fatalf("status after detach: %v, want ErrNotPinned", err)
	}
}

// attachForeign attaches a bare XDP_PASS program named "foreign" in generic
// mode through netlink, as `ip link set dev X xdpgeneric obj ...` does.
func attachForeign(t *testing.T, p *testenv.Pair) uint32 {
	t.Helper()
	testenv.AttachForeign(t, p.Coll, p.CollIf, testenv.NamedProgram(t, "foreign", xdpPassAction))
	x := testenv.XDP(t, p.Coll, p.CollIf)
	id, name := x.ID, x.Name
	if name != "foreign" {
		t.Fatalf("foreign program not attached: %d %q", id, name)
	}
	return id
}

// TestForeignProgramUntouched: run and detach both refuse to touch another
// XDP program, and say whose it is.
func TestForeignProgramUntouched(t *testing.T) {
	for _, c := range []struct {
		name   string
		attach func(*testing.T, *testenv.Pair) uint32
	}{{"netlink", attachForeign}, {"ip link obj", attachForeignObj}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // a veth pair each, no traffic judged
			testForeignProgramUntouched(t, c.attach)
		})
	}
}

// attachForeignObj compiles a one-line XDP_PASS program with the Makefile's
// clang and attaches it with `ip link set dev X xdpgeneric obj F sec xdp`,
// as an operator would.
func attachForeignObj(t *testing.T, p *testenv.Pair) uint32 {
	t.Helper()
	clang := "clang-19"
	if _, err := exec.LookPath(clang); err != nil {
		if os.Getenv(testenv.RequireEnv) == "1" {
			t.Fatalf("%s not installed (CI installs it)", clang)
		}
		t.Skipf("%s not installed", clang)
	}
	dir := t.TempDir()
	src, obj := filepath.Join(dir, "foreign.c"), filepath.Join(dir, "foreign.o")
	prog := `__attribute__((section("xdp"), used)) int foreign(void *ctx) { return 2; }
char _license[] __attribute__((section("license"), used)) = "GPL";
`
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(clang, "-O2", "-g", "-target", "bpf", "-c", src, "-o", obj).CombinedOutput(); err != nil {
		t.Fatalf("compile foreign program: %v\n%s", err, out)
	}
	if out, err := p.Coll.Command(context.Background(), "ip", "link", "set", "dev", p.CollIf, "xdpgeneric", "obj", obj, "sec", "xdp").CombinedOutput(); err != nil {
		t.Fatalf("ip link set xdpgeneric obj: %v\n%s", err, out)
	}
	x := testenv.XDP(t, p.Coll, p.CollIf)
	if x.Name != "foreign" || x.Mode != "generic" {
		t.Fatalf("foreign program not attached: %+v", x)
	}
	return x.ID
}

func testForeignProgramUntouched(t *testing.T, attach func(*testing.T, *testenv.Pair) uint32) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	id := attach(t, p)

	_, err := newAgent(p, agent.Config{PinPath: pinPath}, defaultPolicy())
	if !errors.Is(err, pin.ErrForeignProgram) {
		t.Fatalf("start on a foreign program: %v, want ErrForeignProgram", err)
	}
	for _, want := range []string{fmt.Sprint(id), `"foreign"`, p.CollIf} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "--") {
		t.Errorf("error %q names a command-line flag: that is cmd's wording", err)
	}
	if got := testenv.XDP(t, p.Coll, p.CollIf).ID; got != id {
		t.Fatalf("foreign program %d replaced by %d", id, got)
	}
	if _, err := os.Stat(pinPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused start left %s behind", pinPath)
	}
	matches, _ := filepath.Glob(pinPath + "-tmp-*")
	if len(matches) > 0 {
		t.Errorf("a refused start left %v behind", matches)
	}

	err = p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) })
	if !errors.Is(err, pin.ErrForeignProgram) || !strings.Contains(err.Error(), "foreign") {
		t.Fatalf("detach of a foreign program: %v, want ErrForeignProgram naming it", err)
	}
	if got := testenv.XDP(t, p.Coll, p.CollIf).ID; got != id {
		t.Fatalf("detach removed the foreign program")
	}

	// With Replace, the agent takes over the interface.
	a, err := newAgent(p, agent.Config{Replace: true}, defaultPolicy())
	if err != nil {
		t.Fatalf("start with Replace: %v", err)
	}
	if name := testenv.XDP(t, p.Coll, p.CollIf).Name; name != pin.ProgramName {
		t.Fatalf("with Replace: %q attached", name)
	}
	a.Close()
	if got := testenv.XDP(t, p.Coll, p.CollIf).ID; got != 0 {
		t.Fatalf("unpinned agent left program %d attached", got)
	}
}

// TestSecondAgentRefused: while an agent runs, a second one on the same pin
// path and `detach` are refused, and the running agent's policy is
// untouched.
func TestSecondAgentRefused(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	a := startPinned(t, p, pinPath, defaultPolicy())
	defer func() {
		a.Close()
		p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) })
	}()
	other := defaultPolicy()
	other.Max, other.Mode = 50, tiers.ModeDryRun
	_, err := newAgent(p, agent.Config{PinPath: pinPath}, other)
	if !errors.Is(err, pin.ErrAgentRunning) || !strings.Contains(err.Error(), fmt.Sprint("pid ", os.Getpid())) {
		t.Fatalf("second agent: %v, want ErrAgentRunning naming pid %d", err, os.Getpid())
	}
	if err := p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) }); !errors.Is(err, pin.ErrAgentRunning) {
		t.Fatalf("detach under a running agent: %v, want ErrAgentRunning", err)
	}
	act, err := a.Limiter().Active()
	if err != nil {
		t.Fatal(err)
	}
	if act.Max != 100 || act.Mode != tiers.ModeEnforce {
		t.Fatalf("the refused agent changed the policy: max %d mode %v", act.Max, act.Mode)
	}
	if testenv.XDP(t, p.Coll, p.CollIf).Name != pin.ProgramName {
		t.Fatal("limiter gone after a refused second agent")
	}
}

// TestModeSwitchOnAdoption: restarting with an explicit --xdp-mode other
// than the pinned link's re-attaches in that mode; auto keeps the link.
func TestModeSwitchOnAdoption(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	t.Cleanup(func() { p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) }) })
	for _, step := range []struct {
		mode attach.XDPMode
		want string
	}{{attach.XDPGeneric, "generic"}, {attach.XDPAuto, "generic"}, {attach.XDPNative, "native"}, {attach.XDPGeneric, "generic"}} {
		a, err := newAgent(p, agent.Config{PinPath: pinPath, XDPMode: step.mode}, defaultPolicy())
		if err != nil {
			t.Fatalf("start in %s: %v", step.mode, err)
		}
		got := testenv.XDP(t, p.Coll, p.CollIf).Mode
		a.Close()
		if got != step.want {
			t.Fatalf("--xdp-mode %s after a restart: attached %s, want %s", step.mode, got, step.want)
		}
	}

	// A switch the driver refuses puts the limiter back in the old mode:
	// veth refuses native XDP when its peer's MTU exceeds a page (ERANGE).
	if out, err := p.Send.Command(context.Background(), "ip", "link", "set", "dev", p.SendIf, "mtu", "9000").CombinedOutput(); err != nil {
		t.Fatalf("set mtu: %v %s", err, out)
	}
	a, err := newAgent(p, agent.Config{PinPath: pinPath, XDPMode: attach.XDPNative}, defaultPolicy())
	if err == nil {
		a.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "stays attached in generic mode") {
		t.Fatalf("refused switch to native: %v, want an error saying the limiter stays in generic mode", err)
	}
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.Mode != "generic" || x.Name != pin.ProgramName {
		t.Fatalf("after a refused switch: %+v attached, want tierlimit in generic mode", x)
	}
	if _, err := os.Stat(filepath.Join(pinPath, "links", p.CollIf)); err != nil {
		t.Fatalf("after a refused switch the link is not pinned: %v", err)
	}
}

// TestWatchLogsLostInterface: when the limited interface goes away, the
// agent logs it, /healthz turns 503, and the exit log does not claim the
// limiter stays attached there.
func TestWatchLogsLostInterface(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	var logs testenv.SyncBuffer
	a, err := newAgent(p, agent.Config{PinPath: testenv.PinPath(t, pin.LockFile), Logger: slog.New(slog.NewTextHandler(&logs, nil))}, defaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Watch(ctx, 20*time.Millisecond)
	if err := p.Coll.Command(ctx, "ip", "link", "del", p.CollIf).Run(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(logs.String(), "limiter no longer attached") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "limiter no longer attached") {
		t.Fatalf("no log line for the lost interface:\n%s", logs.String())
	}
	if a.Attached() {
		t.Fatal("Attached() with the interface gone")
	}
	cancel()
	a.Close()
	if strings.Contains(logs.String(), "stays attached") {
		t.Fatalf("exit log claims the limiter stays on a deleted interface:\n%s", logs.String())
	}
}
