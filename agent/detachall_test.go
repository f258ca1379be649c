package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestDetachAll is the package's removal (issue 24 part 3): in the
// collector's namespace, a limiter pinned under a recorded pin path, one
// whose pin path nobody recorded (TIERLIMIT_OPTS named another --pin-path,
// or TIERLIMIT_IFACES changed since), and a tierlimit program attached
// through netlink all go; a foreign program in the namespace and a
// tierlimit link in another namespace stay.
func TestDetachAll(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	recorded := testenv.PinPath(t, pin.LockFile)
	unrecorded := testenv.PinPath(t, pin.LockFile)
	addVeth(t, p.Coll, "dxa0", "dxa1")
	addVeth(t, p.Coll, "dxb0", "dxb1")

	a := startPinned(t, p, recorded, defaultPolicy())
	closeAgent(t, a)
	b, err := newAgent(p, agent.Config{PinPath: unrecorded, Interfaces: []string{"dxa0"}, XDPMode: attach.XDPGeneric}, defaultPolicy())
	if err != nil {
		t.Fatalf("agent on dxa0: %v", err)
	}
	closeAgent(t, b)
	if !slices.Contains(pin.RecordedPinPaths(), recorded) {
		t.Fatalf("RecordedPinPaths %v lacks %s", pin.RecordedPinPaths(), recorded)
	}
	if err := os.Remove(pin.LockFile(unrecorded)); err != nil {
		t.Fatal(err)
	}
	named := testenv.NamedProgram(t, pin.ProgramName, xdpPassAction)
	foreign := testenv.NamedProgram(t, "foreign", xdpPassAction)
	testenv.AttachForeign(t, p.Coll, "dxa1", named)
	testenv.AttachForeign(t, p.Coll, "dxb0", foreign)
	// On the sender's lo: ifindex 1, as the collector namespace's lo.
	var elsewhere link.Link
	if err := p.Send.Do(func() (err error) {
		elsewhere, err = link.AttachXDP(link.XDPOptions{Program: named, Interface: 1, Flags: link.XDPGenericMode})
		return err
	}); err != nil {
		t.Fatalf("tierlimit link in the sender's namespace: %v", err)
	}
	t.Cleanup(func() { elsewhere.Close() })

	var rm pin.Removed
	if err := p.Coll.Do(func() (err error) { rm, err = pin.DetachAll([]string{recorded}); return err }); err != nil {
		t.Fatalf("DetachAll: %v (removed %+v)", err, rm)
	}
	t.Logf("removed %+v", rm)
	for _, ifc := range []string{p.CollIf, "dxa0", "dxa1"} {
		if x := testenv.XDP(t, p.Coll, ifc); x.ID != 0 {
			t.Errorf("%s still runs program %d %q", ifc, x.ID, x.Name)
		}
	}
	if x := testenv.XDP(t, p.Coll, "dxb0"); x.Name != "foreign" {
		t.Errorf("dxb0 runs %d %q, want the foreign program left alone", x.ID, x.Name)
	}
	if x := testenv.XDP(t, p.Send, "lo"); x.Name != pin.ProgramName {
		t.Errorf("the sender namespace's lo runs %d %q, want its tierlimit link left alone", x.ID, x.Name)
	}
	if _, err := os.Stat(recorded); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("recorded pin dir %s: %v, want it removed", recorded, err)
	}
	if _, err := os.Stat(filepath.Join(unrecorded, "maps")); err != nil {
		t.Errorf("unrecorded pin dir %s: %v, want it left (it was not named)", unrecorded, err)
	}
	if len(rm.Links) != 2 || len(rm.Netlink) != 1 || len(rm.PinDirs) != 1 {
		t.Errorf("removed %d links, %d netlink programs, %d pin dirs; want 2, 1, 1", len(rm.Links), len(rm.Netlink), len(rm.PinDirs))
	}
}

// TestDetachAllRefusesRunningAgent: with an agent running on one of the
// pin paths, DetachAll touches nothing.
func TestDetachAllRefusesRunningAgent(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	a := startPinned(t, p, pinPath, defaultPolicy())
	t.Cleanup(func() {
		a.Close()
		p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) })
	})
	id := testenv.XDP(t, p.Coll, p.CollIf).ID
	var running *pin.AgentRunningError
	err := p.Coll.Do(func() error { _, err := pin.DetachAll([]string{pinPath}); return err })
	if !errors.As(err, &running) {
		t.Fatalf("DetachAll with an agent running: %v, want *AgentRunningError", err)
	}
	if got := testenv.XDP(t, p.Coll, p.CollIf).ID; got != id {
		t.Fatalf("after the refusal %s runs program %d, want %d untouched", p.CollIf, got, id)
	}
}

func closeAgent(t *testing.T, a *agent.Agent) {
	t.Helper()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// addVeth adds a veth pair, both ends up, inside ns.
func addVeth(t *testing.T, ns *testenv.NS, name, peer string) {
	t.Helper()
	if err := ns.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			return err
		}
		for _, n := range []string{name, peer} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("veth %s in %s: %v", name, ns.Name, err)
	}
}

// xdpProgram loads an XDP program named name that passes everything.
// xdpPassAction is XDP_PASS, what the foreign programs of these tests
// return.
const xdpPassAction = 2

// TestDetachPinPath (issue 43): detach --all without --everything removes
// only what one pin path's agent recorded: the links pinned under it (and
// any other attachment of its pinned program) and its pin directory. The
// limiter of another pin path (a second agent, a test suite's) keeps its
// link and its pins, and Left names both, as do the interfaces that still
// run tierlimit.
func TestDetachPinPath(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	mine, other := testenv.PinPath(t, pin.LockFile), testenv.PinPath(t, pin.LockFile)
	addVeth(t, p.Coll, "dpa0", "dpa1")
	closeAgent(t, startPinned(t, p, mine, defaultPolicy()))
	b, err := newAgent(p, agent.Config{PinPath: other, Interfaces: []string{"dpa0"}, XDPMode: attach.XDPGeneric}, defaultPolicy())
	if err != nil {
		t.Fatalf("agent on dpa0: %v", err)
	}
	closeAgent(t, b)
	t.Cleanup(func() { p.Coll.Do(func() error { return pin.Detach(other, "dpa0") }) })
	var rm pin.Removed
	var left pin.Left
	if err := p.Coll.Do(func() (err error) { rm, left, err = pin.DetachPinPath(mine, []string{other}); return err }); err != nil {
		t.Fatalf("DetachPinPath: %v (removed %+v)", err, rm)
	}
	t.Logf("removed %+v, left %+v", rm, left)
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != 0 {
		t.Errorf("%s still runs program %d", p.CollIf, x.ID)
	}
	if _, err := os.Stat(mine); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: %v, want it removed", mine, err)
	}
	if x := testenv.XDP(t, p.Coll, "dpa0"); x.Name != pin.ProgramName {
		t.Errorf("dpa0 runs %d %q, want the other pin path's limiter left", x.ID, x.Name)
	}
	if _, err := os.Stat(filepath.Join(other, "links", "dpa0")); err != nil {
		t.Errorf("the other pin path's link pin: %v, want it left", err)
	}
	if !slices.Contains(left.Ifaces, "dpa0") || !slices.Contains(left.PinDirs, other) {
		t.Errorf("left %+v, want dpa0 and %s named", left, other)
	}
	if len(rm.Links) != 1 || len(rm.PinDirs) != 1 {
		t.Errorf("removed %+v, want one link and one pin dir", rm)
	}
}
