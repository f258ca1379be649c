package agent_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestOtherHostMAC checks the MAC check of docs/design.md §2 (bpf/host.h) on
// a veth, with the agent describing it: datagrams to an address the
// collector owns but sent to another host's MAC, which Linux discards
// (PACKET_OTHERHOST), pass uncounted; once a macvlan child in bridge mode
// sits on the veth, the agent turns the check off (followed through
// netlink), and a flood to the child's MAC, which Linux delivers to the
// child's socket, is counted and judged: no evasion.
func TestOtherHostMAC(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	a := startAgent(t, p, attach.XDPAuto, policy(t, 40))
	waitCheckMAC(t, a, true)

	other := netip.MustParseAddr("198.51.100.60")
	otherMAC := net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x99}
	testenv.AddAddr(t, p.Coll, p.CollIf, netip.PrefixFrom(other, 32))
	// A local destination first, so that only the MAC makes these frames
	// not this host's.
	waitLocalPrefix(t, a, netip.PrefixFrom(other, 32), true)
	sendNeigh(t, p, other, otherMAC)
	// Unselected counts every frame the program passes unjudged: a stray
	// ARP or IPv6 neighbour or multicast-listener frame on the veth may add
	// one or two (31 in one run).
	if sel, unsel := countSent(t, a, p, other, 30); sel != 0 || unsel < 30 || unsel > 35 {
		t.Errorf("to %v at another host's MAC %v: %d of 30 counted, %d unselected; want none counted, 30 unselected (and up to 5 stray frames)", other, otherMAC, sel, unsel)
	}

	child := netip.MustParseAddr("198.51.100.70")
	childMAC := net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x70}
	addMacvlan(t, p, childMAC, child)
	waitCheckMAC(t, a, false)
	waitLocalPrefix(t, a, netip.PrefixFrom(child, 32), true)
	sendNeigh(t, p, child, childMAC)
	rx := testenv.NewReceiver(t, p.Coll, netip.AddrPortFrom(child, 514))
	s0 := stats(t, a)
	const n = 200
	if sel, _ := countSent(t, a, p, child, n); sel != n {
		t.Errorf("to the macvlan child's MAC: %d of %d counted, want all", sel, n)
	}
	rx.WaitQuiet(200*time.Millisecond, 3*time.Second)
	_, got := rx.Counts()
	s1 := stats(t, a)
	drops := s1.SelectedTotal(tiers.VerdictDrop).Packets - s0.SelectedTotal(tiers.VerdictDrop).Packets
	if drops == 0 || got == 0 || got+int(drops) != n {
		t.Errorf("flood of %d to the child (max 40): %d dropped, the child's socket received %d; want drops, and the rest received", n, drops, got)
	}

	// A child that lives in another namespace (a container's) is no
	// link here: what it did to the veth keeps the check off, read again
	// on each watch round. A veth has no unicast filter, so the child's
	// MAC made it promiscuous; a NIC with one lists the MAC instead
	// (TestOtherUnicast).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Watch(ctx, 100*time.Millisecond)
	moveUp(t, p, testenv.NewNS(t), "tlmv0")
	time.Sleep(300 * time.Millisecond)
	waitCheckMAC(t, a, false)
}

// moveUp moves the collector namespace's link name into ns, and sets it
// up there.
func moveUp(t *testing.T, p *testenv.Pair, ns *testenv.NS, name string) {
	t.Helper()
	f, err := os.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := p.Coll.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(l, int(f.Fd()))
	}); err != nil {
		t.Fatal(err)
	}
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}); err != nil {
		t.Fatal(err)
	}
}

// countSent sends n datagrams from the sender to dst:514 and returns how
// many the program counted as selected and as unselected, once all n
// reached it.
func countSent(t *testing.T, a *agent.Agent, p *testenv.Pair, dst netip.Addr, n int) (sel, unsel uint64) {
	t.Helper()
	s0 := stats(t, a)
	s := testenv.NewSender(t, p.Send, netip.AddrPortFrom(dst, 514))
	if _, err := s.Pace(context.Background(), n, 50*time.Millisecond, 5*time.Second, func(i int) []byte { return testenv.SyslogMessage(1, i) }); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s1 := stats(t, a)
		sel, unsel = s1.SelectedPackets()-s0.SelectedPackets(), s1.Unselected.Packets-s0.Unselected.Packets
		if sel+unsel >= uint64(n) || time.Now().After(deadline) {
			return sel, unsel
		}
	}
}

// waitCheckMAC waits until the agent has told the program that it checks
// the collector veth's MAC, or that it does not (want).
func waitCheckMAC(t *testing.T, a *agent.Agent, want bool) {
	t.Helper()
	var ifs []bpf.Iface
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ifs = a.Ifaces(); len(ifs) == 1 && ifs[0].CheckMAC == want && ifs[0].Martians {
			return
		}
	}
	t.Fatalf("interfaces described %+v after 5 s, want the MAC check %v", ifs, want)
}

// sendNeigh makes the sender reach addr at mac, on its veth.
func sendNeigh(t *testing.T, p *testenv.Pair, addr netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	if err := p.Send.Do(func() error {
		l, err := netlink.LinkByName(p.SendIf)
		if err != nil {
			return err
		}
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT, IP: addr.AsSlice(), HardwareAddr: mac})
	}); err != nil {
		t.Fatal(err)
	}
}

// addMacvlan puts a macvlan child in bridge mode with mac and the /32
// addr on the collector's veth, in the collector's namespace (which goes,
// with it, at the end of the test), with rp_filter off there: the route
// back to the sender is through the veth, not the child.
func addMacvlan(t *testing.T, p *testenv.Pair, mac net.HardwareAddr, addr netip.Addr) {
	t.Helper()
	if err := p.Coll.Do(func() error {
		parent, err := netlink.LinkByName(p.CollIf)
		if err != nil {
			return err
		}
		mv := &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "tlmv0", ParentIndex: parent.Attrs().Index, HardwareAddr: mac}, Mode: netlink.MACVLAN_MODE_BRIDGE}
		if err := netlink.LinkAdd(mv); err != nil {
			return err
		}
		for _, dev := range []string{"all", "tlmv0"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+dev+"/rp_filter", []byte("0"), 0o644); err != nil {
				return err
			}
		}
		if err := netlink.AddrAdd(mv, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(mv)
	}); err != nil {
		t.Fatal(err)
	}
}
