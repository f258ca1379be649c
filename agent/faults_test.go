package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// The faults an operator's bad day brings (issue 11): each test makes the
// event happen under a real agent in its own namespaces and checks that the
// agent says, and does, what the README's Operations notes promise.

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
func detachAtEnd(t *testing.T, p *testenv.Pair, pin, iface string) {
	t.Cleanup(func() { p.Coll.Do(func() error { return agent.Detach(pin, iface) }) })
}

// TestPinDirRemovedWhileRunning (A1): `rm -rf` of the pin directory under a
// running agent is noticed, logged and repaired from the agent's fds, so
// the limiter stays attached and pinned when it stops, as its stop message
// says. A link pin removed with no Watch to repair it makes the stop
// message say the limiter goes, and it does.
func TestPinDirRemovedWhileRunning(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pin := testenv.PinPath(t, agent.LockFile)
	detachAtEnd(t, p, pin, p.CollIf)
	a, logs := watched(t, p, agent.Config{PinPath: pin})
	id := testenv.XDP(t, p.Coll, p.CollIf).ID
	if err := os.RemoveAll(pin); err != nil {
		t.Fatal(err)
	}
	waitLog(t, logs, "pinned state removed while the agent runs")
	waitLog(t, logs, "pinned state restored")
	for _, f := range []string{"links/" + p.CollIf, "maps/window", "maps/stats", "program"} {
		deadline := time.Now().Add(2 * time.Second)
		_, err := os.Stat(filepath.Join(pin, f))
		for ; err != nil && time.Now().Before(deadline); _, err = os.Stat(filepath.Join(pin, f)) {
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
	st, err := agent.ReadStatus(pin)
	if err != nil || st.Stats.SelectedPackets() != 7 {
		t.Fatalf("status of the re-pinned maps: %v, %d selected, want 7", err, st.Stats.SelectedPackets())
	}

	// Without Watch, the stop message tells the truth about a removed link pin.
	var logs2 testenv.SyncBuffer
	a2, err := newAgent(p, agent.Config{PinPath: pin, Logger: slog.New(slog.NewTextHandler(&logs2, nil))}, defaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(pin, "links", p.CollIf)); err != nil {
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
	pin := testenv.PinPath(t, agent.LockFile)
	name := "tlre" + sandbox.RandHex(3)
	old := vethIn(t, p.Coll, name)
	detachAtEnd(t, p, pin, name)
	a, logs := watched(t, p, agent.Config{PinPath: pin, Interfaces: []string{name}})
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
	st, err := agent.ReadStatus(pin)
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
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "foreign", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		return netlink.LinkSetXdpFdWithFlags(l, prog.FD(), nl.XDP_FLAGS_SKB_MODE)
	}); err != nil {
		t.Fatalf("attach foreign program: %v", err)
	}
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
	pin := testenv.PinPath(t, agent.LockFile)
	a1, b1, c1 := "tlra"+sandbox.RandHex(3), "tlrb"+sandbox.RandHex(3), "tlrc"+sandbox.RandHex(3)
	vethIn(t, p.Coll, a1)
	detachAtEnd(t, p, pin, c1)
	a, logs := watched(t, p, agent.Config{PinPath: pin, Interfaces: []string{a1}})
	prog := testenv.XDP(t, p.Coll, a1).ID
	ipIn(t, p.Coll, "link", "set", a1, "down")
	ipIn(t, p.Coll, "link", "set", a1, "name", b1)
	ipIn(t, p.Coll, "link", "set", b1, "up")
	waitLog(t, logs, "interface renamed: the limiter stays on it")
	if _, err := os.Stat(filepath.Join(pin, "links", b1)); err != nil {
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
	a2, err := newAgent(p, agent.Config{PinPath: pin, Interfaces: []string{c1}, Logger: slog.New(slog.NewTextHandler(&logs2, nil))}, defaultPolicy())
	if err != nil {
		t.Fatalf("run --iface %s after a rename: %v", c1, err)
	}
	for _, want := range []string{`interface was renamed: its pinned link follows" from=` + b1 + " to=" + c1, "adopted pinned link"} {
		if !strings.Contains(logs2.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs2.String())
		}
	}
	if x := testenv.XDP(t, p.Coll, c1); x.ID == prog || x.Name != agent.ProgramName {
		t.Errorf("after adopting: %+v, want a new tierlimit program replacing %d in place", x, prog)
	}
	a2.Close()
	ipIn(t, p.Coll, "link", "set", c1, "down")
	ipIn(t, p.Coll, "link", "set", c1, "name", a1)
	if err := p.Coll.Do(func() error { return agent.Detach(pin, a1) }); err != nil {
		t.Fatalf("detach --iface %s after a rename: %v", a1, err)
	}
	if x := testenv.XDP(t, p.Coll, a1); x.ID != 0 {
		t.Fatalf("after detach: %+v attached", x)
	}
}

// TestLockIsThePinnedState (C10): the lock follows the pinned state, not
// the spelling of its path, and survives the removal of its file under /run.
func TestLockIsThePinnedState(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pin := testenv.PinPath(t, agent.LockFile)
	a := startPinned(t, p, pin, defaultPolicy())
	t.Cleanup(func() { a.Close(); p.Coll.Do(func() error { return agent.Detach(pin, p.CollIf) }) })
	t.Chdir(filepath.Dir(pin))
	wantRunning := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, agent.ErrAgentRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d)", os.Getpid())) {
			t.Errorf("%s: %v, want ErrAgentRunning naming pid %d", what, err, os.Getpid())
		}
	}
	for _, spelling := range []string{filepath.Base(pin), "./" + filepath.Base(pin), "../bpf/" + filepath.Base(pin) + "/"} {
		wantRunning("detach --pin-path "+spelling, p.Coll.Do(func() error { return agent.Detach(spelling, p.CollIf) }))
		_, err := newAgent(p, agent.Config{PinPath: spelling}, defaultPolicy())
		wantRunning("second agent with --pin-path "+spelling, err)
	}
	// A half-written lock file (the holder between truncate and write) does
	// not make the pid unreadable: it comes from the kernel.
	if err := os.Truncate(agent.LockFile(pin), 0); err != nil {
		t.Fatal(err)
	}
	_, err := newAgent(p, agent.Config{PinPath: pin}, defaultPolicy())
	wantRunning("second agent, empty lock file", err)
	// tmpfiles removes the lock file: the pin directory's own lock holds.
	if err := os.Remove(agent.LockFile(pin)); err != nil {
		t.Fatal(err)
	}
	_, err = newAgent(p, agent.Config{PinPath: pin}, defaultPolicy())
	wantRunning("second agent, lock file removed", err)
	wantRunning("detach, lock file removed", p.Coll.Do(func() error { return agent.Detach(pin, p.CollIf) }))
	if _, err := os.Stat(filepath.Join(pin, "links", p.CollIf)); err != nil {
		t.Fatalf("the running agent's pins were touched: %v", err)
	}
	if act, err := a.Limiter().Active(); err != nil || act.Max != 100 {
		t.Fatalf("the running agent's policy changed: %+v %v", act, err)
	}
}

// prefixes returns n distinct IPv4 /24s (10.0.0.0/24 ...) and n IPv6 /64s.
func prefixes(n int) (v4, v6 []netip.Prefix) {
	for i := range n {
		v4 = append(v4, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
		v6 = append(v6, netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xee, 0, byte(i >> 8), byte(i)}), 64))
	}
	return v4, v6
}

// TestPrefixLimits (C11): a policy with tiers.MaxPrefixes exempt sources
// and as many dests starts, reloads unchanged again and again, and exempts;
// one more is refused by Validate (what check runs) and by New alike,
// naming the key.
func TestPrefixLimits(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	v4, v6 := prefixes(tiers.MaxPrefixes)
	pol := defaultPolicy()
	pol.Exempt = append(v4[:tiers.MaxPrefixes-1:tiers.MaxPrefixes-1], netip.MustParsePrefix("198.51.100.0/24"))
	pol.Select = append(pol.Select, tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 515, Last: 515}}, Dests: v6})
	a := startAgent(t, p, agent.XDPAuto, pol)
	for i := range 3 {
		if err := a.Reload(pol); err != nil {
			t.Fatalf("reload %d of the unchanged policy: %v", i+1, err)
		}
	}
	sendUDP(t, p, 514, 5)
	if st, err := a.Limiter().Stats(); err != nil || st.Exempt.Packets != 5 {
		t.Fatalf("exempt %d (%v), want 5 from the last of %d exempt prefixes", st.Exempt.Packets, err, len(pol.Exempt))
	}

	over := pol
	over.Exempt = append(slicesClone(pol.Exempt), netip.MustParsePrefix("192.0.2.0/24"))
	checkErr := over.Validate()
	var ce *tiers.ConfigError
	if !errors.As(checkErr, &ce) || ce.Key != "exempt.sources" || !errors.Is(checkErr, tiers.ErrTooMany) || !strings.Contains(checkErr.Error(), strconv.Itoa(tiers.MaxPrefixes)) {
		t.Fatalf("Validate with %d exempt prefixes: %v, want ErrTooMany on exempt.sources naming %d", len(over.Exempt), checkErr, tiers.MaxPrefixes)
	}
	if err := a.Reload(over); err == nil || err.Error() != checkErr.Error() {
		t.Fatalf("reload with one prefix too many: %v, want the same error as check: %v", err, checkErr)
	}

	// A reload that rewrites every prefix gives up when its context ends
	// (SIGTERM), and the old policy stays, whole.
	changed := pol
	changed.Max = 77
	changed.Exempt = nil
	for _, e := range pol.Exempt {
		b := e.Addr().As4()
		b[0]++
		changed.Exempt = append(changed.Exempt, netip.PrefixFrom(netip.AddrFrom4(b), e.Bits()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.ReloadContext(ctx, changed); !errors.Is(err, context.Canceled) {
		t.Fatalf("reload with an ended context: %v, want context.Canceled", err)
	}
	if act, err := a.Limiter().Active(); err != nil || act.Max != 100 {
		t.Fatalf("after an abandoned reload: max %d (%v), want the old 100", act.Max, err)
	}
	if err := a.Reload(changed); err != nil {
		t.Fatalf("reload after an abandoned one: %v", err)
	}
	if act, _ := a.Limiter().Active(); act.Max != 77 {
		t.Fatalf("after the reload: max %d, want 77", act.Max)
	}
}

func slicesClone[T any](s []T) []T { return append([]T(nil), s...) }

// TestManyPortRanges (C12): 100,000 overlapping port ranges cost a start
// and a reload no more than a policy of one port: the ranges are merged
// before the port array is written. The bound is 5 s for each, against
// 18 s before.
func TestManyPortRanges(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pol := defaultPolicy()
	var rs []tiers.PortRange
	for i := range 100000 {
		// Wide, overlapping ranges: written port by port, they would be
		// 6·10^9 writes into the array.
		first := uint16(1 + (i*7919)%1000)
		rs = append(rs, tiers.PortRange{First: first, Last: 65535 - uint16(i%100)})
	}
	pol.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: rs}}
	start := time.Now()
	a := startAgent(t, p, agent.XDPAuto, pol)
	started := time.Since(start)
	start = time.Now()
	if err := a.Reload(pol); err != nil {
		t.Fatal(err)
	}
	reloaded := time.Since(start)
	t.Logf("100,000 port ranges: start %v, reload %v", started, reloaded)
	if started > 5*time.Second || reloaded > 5*time.Second {
		t.Errorf("start %v, reload %v: want each under 5s", started, reloaded)
	}
	sendUDP(t, p, 514, 3)
	if st, _ := a.Limiter().Stats(); st.SelectedPackets() != 3 {
		t.Errorf("%d selected, want 3 (port 514 is in a range)", st.SelectedPackets())
	}
}

// TestDottedAndLongInterfaceNames (C13): VLAN-style names with a dot and
// 15-character names (IFNAMSIZ-1) are pinned, listed, adopted on restart
// and detached.
func TestDottedAndLongInterfaceNames(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pin := testenv.PinPath(t, agent.LockFile)
	// VLAN sub-interface names; any interface may carry them, and veth
	// needs no module.
	names := []string{"tlv" + sandbox.RandHex(2) + ".100", "tl" + sandbox.RandHex(4) + ".4094", "tl" + sandbox.RandHex(6) + "z"}
	for _, n := range names {
		vethIn(t, p.Coll, n)
	}
	if len(names[1]) != 15 || len(names[2]) != 15 {
		t.Fatalf("test names %q are not 15 characters", names[1:])
	}
	for _, n := range names {
		detachAtEnd(t, p, pin, n)
	}
	for run := range 2 {
		var logs testenv.SyncBuffer
		a, err := newAgent(p, agent.Config{PinPath: pin, Interfaces: names, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, defaultPolicy())
		if err != nil {
			t.Fatalf("run %d on %q: %v", run+1, names, err)
		}
		a.Close()
		if run == 1 && strings.Count(logs.String(), "adopted pinned link") != len(names) {
			t.Errorf("restart did not adopt every link:\n%s", logs.String())
		}
	}
	st, err := agent.ReadStatus(pin)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range st.Links {
		got = append(got, l.Iface)
	}
	if strings.Join(got, " ") != strings.Join(sortedCopy(names), " ") {
		t.Errorf("status lists %q, want %q", got, sortedCopy(names))
	}
	for _, n := range names {
		if err := p.Coll.Do(func() error { return agent.Detach(pin, n) }); err != nil {
			t.Errorf("detach %s: %v", n, err)
		}
		if x := testenv.XDP(t, p.Coll, n); x.ID != 0 {
			t.Errorf("%s still runs %+v", n, x)
		}
	}
}

// TestPinName: every byte an interface name may hold survives the
// encoding, and no encoded name holds a dot (bpffs refuses those).
func TestPinName(t *testing.T) {
	for _, n := range []string{"eth0", "eth0.100", "a.b.c", "x%2Ey", "%", "%25.", "vlan.4094", "..."} {
		enc := agent.PinName(n)
		if strings.Contains(enc, ".") || agent.UnpinName(enc) != n {
			t.Errorf("PinName(%q) = %q, back %q", n, enc, agent.UnpinName(enc))
		}
	}
}

func sortedCopy(s []string) []string {
	c := slicesClone(s)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if agent.PinName(c[j]) < agent.PinName(c[i]) {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

// TestIncompatiblePinDir (D): a pinned map whose spec differs from this
// version's (here an unrecorded window of 8 bytes) is migrated, not
// refused (DESIGN.md §11): the agent starts on maps of its own, logs it,
// and leaves its layout recorded; Detach removes it all.
func TestIncompatiblePinDir(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pin := testenv.PinPath(t, agent.LockFile)
	if err := os.MkdirAll(filepath.Join(pin, "maps"), 0o700); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "window", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(pin, "maps", "window")); err != nil {
		t.Fatal(err)
	}
	old.Close()
	var logs testenv.SyncBuffer
	a, err := newAgent(p, agent.Config{PinPath: pin, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, defaultPolicy())
	if err != nil {
		t.Fatalf("start on a pin dir whose window map differs: %v, want a migration", err)
	}
	if !strings.Contains(logs.String(), "migrated pinned state") || !strings.Contains(logs.String(), "window") {
		t.Errorf("the migration is not logged, naming the window:\n%s", logs.String())
	}
	sendUDP(t, p, 514, 5)
	a.Close()
	st, err := agent.ReadStatus(pin)
	if err != nil || st.Layout.Version != bpf.Layout || !st.Layout.Recorded || st.Stats.SelectedPackets() != 5 {
		t.Errorf("status after the migration: %v, layout %v, %d selected, want layout %d and 5", err, st.Layout, st.Stats.SelectedPackets(), bpf.Layout)
	}
	if err := p.Coll.Do(func() error { return agent.Detach(pin, p.CollIf) }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("detach left %s (%v)", pin, err)
	}
}

// TestSecondUnpinnedAgent (D): a second agent without pinning is told that
// another agent holds the interface.
func TestSecondUnpinnedAgent(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	startAgent(t, p, agent.XDPAuto, defaultPolicy())
	_, err := newAgent(p, agent.Config{}, defaultPolicy())
	var busy *agent.BusyError
	if !errors.As(err, &busy) || busy.Iface != p.CollIf || !errors.Is(err, agent.ErrInterfaceBusy) {
		t.Fatalf("second unpinned agent: %v, want a BusyError for %s", err, p.CollIf)
	}
}

// TestDuplicateInterface (D): an interface given twice is refused before
// anything is attached.
func TestDuplicateInterface(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	_, err := newAgent(p, agent.Config{Interfaces: []string{p.CollIf, p.CollIf}}, defaultPolicy())
	if !errors.Is(err, agent.ErrDuplicateInterface) || !strings.Contains(err.Error(), p.CollIf) {
		t.Fatalf("--iface %s twice: %v, want ErrDuplicateInterface naming it", p.CollIf, err)
	}
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != 0 {
		t.Fatalf("refused start attached %+v", x)
	}
}

// TestDeletedInterfaceStatusAndExit (issue 10 §8): after the interface is
// deleted, status says so and what the pinned link still holds; an unpinned
// agent does not claim to detach from an interface that is gone.
func TestDeletedInterfaceStatusAndExit(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pin := testenv.PinPath(t, agent.LockFile)
	name := "tlg" + sandbox.RandHex(3)
	vethIn(t, p.Coll, name)
	a, err := newAgent(p, agent.Config{PinPath: pin, Interfaces: []string{name}}, defaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	prog := testenv.XDP(t, p.Coll, name).ID
	a.Close()
	ipIn(t, p.Coll, "link", "del", name)
	var st agent.Status
	if err := p.Coll.Do(func() (err error) { st, err = agent.ReadStatus(pin); return err }); err != nil {
		t.Fatal(err)
	}
	if len(st.Links) != 1 || !st.Links[0].Gone || st.Links[0].ProgramID != prog || st.Links[0].Mode != "none" {
		t.Fatalf("status links %+v, want %s gone, its link holding program %d", st.Links, name, prog)
	}
	if err := p.Coll.Do(func() error { return agent.Detach(pin, name) }); err != nil {
		t.Fatalf("detach of a deleted interface's link: %v", err)
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("detach left %s", pin)
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
