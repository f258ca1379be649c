package agent_test

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestDestsLocal checks `dests: local`, the default of a parsed rule
// (docs/design.md §2), on a veth: datagrams to the collector's address are
// counted; datagrams to the same port of an address the collector does not
// own (sent to its MAC through a static neighbour), which the kernel
// discards, pass uncounted; a VIP added to lo afterwards is followed
// through netlink, and the collector reached through it keeps working and
// is counted, until the VIP goes away again.
func TestDestsLocal(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	a := startAgent(t, p, attach.XDPAuto, policy(t, 100000))
	vip := netip.MustParseAddr("192.0.2.200")
	other := netip.MustParseAddr("198.51.100.99")

	routeOther(t, p, vip, other)

	// send sends n datagrams to dst and returns how many the program
	// counted as selected, once all n reached it.
	send := func(dst netip.Addr, n int) uint64 {
		t.Helper()
		sel, _ := countSent(t, a, p, dst, n)
		return sel
	}
	vip32 := netip.PrefixFrom(vip, 32)

	if got := send(p.CollAddr, 20); got != 20 {
		t.Errorf("to the collector's address: %d of 20 counted", got)
	}
	if got := send(other, 20); got != 0 {
		t.Errorf("to %v, not the collector's: %d of 20 counted", other, got)
	}
	if got := send(vip, 20); got != 0 {
		t.Errorf("to %v before it is on lo: %d of 20 counted", vip, got)
	}
	testenv.AddAddr(t, p.Coll, "lo", netip.PrefixFrom(vip, 32))
	waitLocalPrefix(t, a, vip32, true)
	rx := testenv.NewReceiver(t, p.Coll, netip.AddrPortFrom(vip, 514))
	if got := send(vip, 20); got != 20 {
		t.Errorf("to the VIP %v on lo: %d of 20 counted", vip, got)
	}
	if !rx.WaitTotal(20, 3*time.Second) {
		_, total := rx.Counts()
		t.Errorf("the collector on the VIP received %d of 20", total)
	}
	delAddr(t, p.Coll, "lo", vip)
	waitLocalPrefix(t, a, vip32, false)
	if got := send(vip, 20); got != 0 {
		t.Errorf("to %v once it left lo: %d of 20 counted", vip, got)
	}
}

// routeOther makes the sender reach other at the collector's MAC (an
// address the collector does not own) and vip through the collector.
func routeOther(t *testing.T, p *testenv.Pair, vip, other netip.Addr) {
	t.Helper()
	var collMAC net.HardwareAddr
	if err := p.Coll.Do(func() error {
		l, err := netlink.LinkByName(p.CollIf)
		collMAC = l.Attrs().HardwareAddr
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sendNeigh(t, p, other, collMAC)
	if err := p.Send.Do(func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: p.CollAddr.AsSlice()})
	}); err != nil {
		t.Fatal(err)
	}
}

// waitLocalPrefix waits up to 3 s until the agent's local prefixes hold
// pfx, or do not (want).
func waitLocalPrefix(t *testing.T, a *agent.Agent, pfx netip.Prefix, want bool) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); slices.Contains(a.LocalPrefixes(), pfx) != want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("local prefixes %v: %v there is %v after 3 s, want %v", a.LocalPrefixes(), pfx, !want, want)
		}
	}
}

// delAddr removes the /32 addr from the interface named ifname in ns.
func delAddr(t *testing.T, ns *testenv.NS, ifname string, addr netip.Addr) {
	t.Helper()
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		return netlink.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
}

func stats(t *testing.T, a *agent.Agent) bpf.Stats {
	t.Helper()
	s, err := a.Limiter().Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
