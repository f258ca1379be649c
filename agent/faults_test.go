package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// The faults an operator's bad day brings (issue 11): each test makes the
// event happen under a real agent in its own namespaces and checks that the
// agent says, and does, what docs/operations.md ("What the agent does when things happen")
// promises.
// This file holds the events on the pin directory and the interface (A1–A4,
// issue 10 §8) and the helpers; faults_limits_test.go the limits and names.

// ipIn runs ip args inside ns and fails t on error.
func ipIn(t *testing.T, ns *testenv.NS, args ...string) {
	t.Helper()
	if out, err := ns.Command(context.Background(), "ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// vethIn makes a veth pair inside ns, name and a random peer, both up,
// and returns name's ifindex. Deleting either end deletes both; the pair
// goes with the namespace.
func vethIn(t *testing.T, ns *testenv.NS, name string, extra ...string) int {
	t.Helper()
	peer := "tp" + sandbox.RandHex(5)
	ipIn(t, ns, append(append([]string{"link", "add", name}, extra...), "type", "veth", "peer", "name", peer)...)
	ipIn(t, ns, "link", "set", peer, "up")
	ipIn(t, ns, "link", "set", name, "up")
	return ifindexIn(t, ns, name)
}

func ifindexIn(t *testing.T, ns *testenv.NS, name string) int {
	t.Helper()
	var idx int
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return idx
}

// watched starts an agent with cfg that logs into a buffer and runs Watch
// every 20ms until the test ends.
func watched(t *testing.T, p *testenv.Pair, cfg agent.Config) (*agent.Agent, *testenv.SyncBuffer) {
	t.Helper()
	logs := &testenv.SyncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	a, err := newAgent(p, cfg, defaultPolicy())
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Watch(ctx, 20*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done; a.Close() })
	return a, logs
}

// waitLog waits up to 5 s for s in logs.
func waitLog(t *testing.T, logs *testenv.SyncBuffer, s string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no log %q within 5s:\n%s", s, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// detachAtEnd detaches iface's pinned limiter when the test ends.
func detachAtEnd(t *testing.T, p *testenv.Pair, pinPath, iface string) {
	t.Cleanup(func() { p.Coll.Do(func() error { return pin.Detach(pinPath, iface) }) })
}

// TestPinDirRemovedWhileRunning (A1): `rm -rf` of the pin directory under a
// running agent is noticed, logged and repaired from the agent's fds, so
// the limiter stays attached and pinned when it stops, as its stop message
// says. A link pin removed with no Watch to repair it makes the stop
// message say the limiter goes, and it does.
func TestPinDirRemovedWhileRunning(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	detachAtEnd(t, p, pinPath, p.CollIf)
	a, logs := watched(t, p, agent.Config{PinPath: pinPath})
	id := testenv.XDP(t, p.Coll, p.CollIf).ID
	if err := os.RemoveAll(pinPath); err != nil {
		t.Fatal(err)
	}
	waitLog(t, logs, "pinned state removed while the agent runs")
	waitLog(t, logs, "pinned state restored")
	for _, f := range []string{"links/" + p.CollIf, "maps/window", "maps/stats", "program", "program_jump"} {
		deadline := time.Now().Add(2 * time.Second)
		_, err := os.Stat(filepath.Join(pinPath, f))
		for ; err != nil && time.Now().Before(deadline); _, err = os.Stat(filepath.Join(pinPath, f)) {
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("after re-pinning: %v", err)
		}
	}
	sendUDP(t, p, 514, 7)
	a.Close()
	if got := testenv.XDP(t, p.Coll, p.CollIf).ID; got != id {
		t.Fatalf("after the agent stopped: program %d on %s, want %d still", got, p.CollIf, id)
	}
	if !strings.Contains(logs.String(), "limiter stays attached and pinned") {
		t.Errorf("stop message does not say the limiter stays:\n%s", logs)
	}
	if pinnedJump(t, pinPath) == 0 {
		t.Error("after the agent stopped: the re-pinned program_jump is empty")
	}
	st, err := agent.ReadStatus(pinPath)
	if err != nil || st.Stats.SelectedPackets() != 7 {
		t.Fatalf("status of the re-pinned maps: %v, %d selected, want 7", err, st.Stats.SelectedPackets())
	}

	// Without Watch, the stop message tells the truth about a removed link pin.
	var logs2 testenv.SyncBuffer
	a2, err := newAgent(p, agent.Config{PinPath: pinPath, Logger: slog.New(slog.NewTextHandler(&logs2, nil))}, defaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(pinPath, "links", p.CollIf)); err != nil {
		t.Fatal(err)
	}
	a2.Close()
	if !strings.Contains(logs2.String(), "pinned link is gone: the limiter is detached") || strings.Contains(logs2.String(), "stays attached") {
		t.Errorf("stop message with the link pin removed:\n%s", logs2.String())
	}
	deadline := time.Now().Add(2 * time.Second)
	for testenv.XDP(t, p.Coll, p.CollIf).ID != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != 0 {
		t.Errorf("the stop message said detached, but %+v is attached", x)
	}
}

// TestInterfaceRecreated (A2): an interface deleted and made again with the
// same name (a new ifindex) gets the limiter back, pinned, and the agent
// logs both events; /healthz is unhealthy only in between.
func TestInterfaceRecreated(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	name := "tlre" + sandbox.RandHex(3)
	old := vethIn(t, p.Coll, name)
	detachAtEnd(t, p, pinPath, name)
	a, logs := watched(t, p, agent.Config{PinPath: pinPath, Interfaces: []string{name}})
	prog := testenv.XDP(t, p.Coll, name).ID
	ipIn(t, p.Coll, "link", "del", name)
	waitLog(t, logs, "limiter no longer attached")
	if a.Attached() {
		t.Fatal("Attached() with the interface deleted")
	}
	// Take old's ifindex with another interface, so the new one gets a new one.
	vethIn(t, p.Coll, "tlfill"+sandbox.RandHex(2), "index", strconv.Itoa(old))
	idx := vethIn(t, p.Coll, name)
	waitLog(t, logs, "interface re-created: limiter attached to it")
	if !a.Attached() {
		t.Fatalf("Attached() false after re-attaching:\n%s", logs)
	}
	if x := testenv.XDP(t, p.Coll, name); x.ID != prog {
		t.Fatalf("re-created %s runs %+v, want the agent's program %d", name, x, prog)
	}
	st, err := agent.ReadStatus(pinPath)
	if err != nil || len(st.Links) != 1 || st.Links[0].Ifindex != idx || st.Links[0].Gone {
		t.Fatalf("pinned links after re-attaching: %+v (%v), want one on ifindex %d", st.Links, err, idx)
	}
	if !strings.Contains(logs.String(), fmt.Sprintf("old_ifindex=%d ifindex=%d", old, idx)) {
		t.Errorf("re-attach log does not give both ifindexes:\n%s", logs)
	}

	// Made again on the very same ifindex: still a new interface.
	n := strings.Count(logs.String(), "interface re-created: limiter attached")
	ipIn(t, p.Coll, "link", "del", name)
	vethIn(t, p.Coll, name, "index", strconv.Itoa(idx))
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(logs.String(), "interface re-created: limiter attached") == n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if x := testenv.XDP(t, p.Coll, name); x.ID != prog || !a.Attached() {
		t.Fatalf("re-created on the same ifindex %d: %+v attached (healthy %v), want program %d:\n%s", idx, x, a.Attached(), prog, logs)
	}
}

// attachForeignTo attaches a bare XDP_PASS program named "foreign" to iface
// in ns, in generic mode through netlink, and returns its id.
func attachForeignTo(t *testing.T, ns *testenv.NS, iface string) uint32 {
	t.Helper()
	testenv.AttachForeign(t, ns, iface, testenv.NamedProgram(t, "foreign", xdpPassAction))
	return testenv.XDP(t, ns, iface).ID
}

// TestHealthNotFooledByReusedIfindex (A3): the limited interface moves to
// another namespace and a different interface with the same ifindex, running
// a foreign program, moves in. The agent is not healthy, and says why.
func TestHealthNotFooledByReusedIfindex(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	name := "tlh" + sandbox.RandHex(3)
	idx := vethIn(t, p.Coll, name)
	a, logs := watched(t, p, agent.Config{Interfaces: []string{name}})
	if !a.Attached() {
		t.Fatal("not attached at start")
	}
	ipIn(t, p.Coll, "link", "set", name, "netns", p.Send.Name)
	waitLog(t, logs, "limiter no longer attached")
	other := "tlo" + sandbox.RandHex(3)
	vethIn(t, p.Coll, other, "index", strconv.Itoa(idx))
	attachForeignTo(t, p.Coll, other)
	time.Sleep(200 * time.Millisecond) // ten Watch rounds
	if a.Attached() {
		t.Fatalf("Attached() with a foreign program on the reused ifindex %d", idx)
	}
	if code, _ := scrape(t, a, "/healthz"); code != 503 {
		t.Errorf("/healthz %d with a foreign program on the ifindex, want 503", code)
	}
	if m := gather(t, a); m.sum("tierlimit_xdp_attached") != 0 {
		t.Errorf("xdp_attached %v, want 0", m.sum("tierlimit_xdp_attached"))
	}
	if strings.Contains(logs.String(), "attached again") {
		t.Errorf("the agent claims the limiter is back:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "another XDP program") {
		// The move is what Watch saw first; the foreign program is what
		// Attached reports now.
		t.Logf("logs:\n%s", logs)
	}
}

// TestInterfaceRenamed (A4): a rename under a running agent moves the link
// pin to the new name and the stop message names it; a rename while no
// agent runs is followed by the next agent (`--iface NEWNAME` adopts the
// link, no gap) and by Detach.
func TestInterfaceRenamed(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	a1, b1, c1 := "tlra"+sandbox.RandHex(3), "tlrb"+sandbox.RandHex(3), "tlrc"+sandbox.RandHex(3)
	vethIn(t, p.Coll, a1)
	detachAtEnd(t, p, pinPath, c1)
	a, logs := watched(t, p, agent.Config{PinPath: pinPath, Interfaces: []string{a1}})
	prog := testenv.XDP(t, p.Coll, a1).ID
	ipIn(t, p.Coll, "link", "set", a1, "down")
	ipIn(t, p.Coll, "link", "set", a1, "name", b1)
	ipIn(t, p.Coll, "link", "set", b1, "up")
	waitLog(t, logs, "interface renamed: the limiter stays on it")
	if _, err := os.Stat(filepath.Join(pinPath, "links", b1)); err != nil {
		t.Errorf("link pin under the new name: %v", err)
	}
	if atts := a.Attachments(); atts[0].Iface != b1 || !a.Attached() {
		t.Errorf("attachments %+v (attached %v), want %s", atts, a.Attached(), b1)
	}
	a.Close()
	if !strings.Contains(logs.String(), `limiter stays attached and pinned" iface=`+b1) {
		t.Errorf("stop message does not name %s:\n%s", b1, logs)
	}

	ipIn(t, p.Coll, "link", "set", b1, "down")
	ipIn(t, p.Coll, "link", "set", b1, "name", c1)
	ipIn(t, p.Coll, "link", "set", c1, "up")
	var logs2 testenv.SyncBuffer
	a2, err := newAgent(p, agent.Config{PinPath: pinPath, Interfaces: []string{c1}, Logger: slog.New(slog.NewTextHandler(&logs2, nil))}, defaultPolicy())
	if err != nil {
		t.Fatalf("run --iface %s after a rename: %v", c1, err)
	}
	for _, want := range []string{`interface was renamed: its pinned link follows" from=` + b1 + " to=" + c1, "adopted pinned link"} {
		if !strings.Contains(logs2.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs2.String())
		}
	}
	if x := testenv.XDP(t, p.Coll, c1); x.ID == prog || x.Name != pin.ProgramName {
		t.Errorf("after adopting: %+v, want a new tierlimit program replacing %d in place", x, prog)
	}
	a2.Close()
	ipIn(t, p.Coll, "link", "set", c1, "down")
	ipIn(t, p.Coll, "link", "set", c1, "name", a1)
	if err := p.Coll.Do(func() error { return pin.Detach(pinPath, a1) }); err != nil {
		t.Fatalf("detach --iface %s after a rename: %v", a1, err)
	}
	if x := testenv.XDP(t, p.Coll, a1); x.ID != 0 {
		t.Fatalf("after detach: %+v attached", x)
	}
}

// TestDeletedInterfaceStatusAndExit (issue 10 §8): after the interface is
// deleted, status says so and what the pinned link still holds; an unpinned
// agent does not claim to detach from an interface that is gone.
func TestDeletedInterfaceStatusAndExit(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	name := "tlg" + sandbox.RandHex(3)
	vethIn(t, p.Coll, name)
	a, err := newAgent(p, agent.Config{PinPath: pinPath, Interfaces: []string{name}}, defaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	prog := testenv.XDP(t, p.Coll, name).ID
	a.Close()
	ipIn(t, p.Coll, "link", "del", name)
	var st agent.Status
	if err := p.Coll.Do(func() (err error) { st, err = agent.ReadStatus(pinPath); return err }); err != nil {
		t.Fatal(err)
	}
	if len(st.Links) != 1 || !st.Links[0].Gone || st.Links[0].ProgramID != prog || st.Links[0].Mode != "none" {
		t.Fatalf("status links %+v, want %s gone, its link holding program %d", st.Links, name, prog)
	}
	if err := p.Coll.Do(func() error { return pin.Detach(pinPath, name) }); err != nil {
		t.Fatalf("detach of a deleted interface's link: %v", err)
	}
	if _, err := os.Stat(pinPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("detach left %s", pinPath)
	}

	vethIn(t, p.Coll, name)
	a2, logs := watched(t, p, agent.Config{Interfaces: []string{name}})
	_ = a2
	ipIn(t, p.Coll, "link", "del", name)
	waitLog(t, logs, "limiter no longer attached")
	a2.Close()
	if strings.Contains(logs.String(), "msg=detached") || !strings.Contains(logs.String(), "nothing to detach") {
		t.Errorf("unpinned exit with the interface gone:\n%s", logs)
	}
}
