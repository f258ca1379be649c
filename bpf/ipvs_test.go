package bpf_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// RequireIPVSEnv, set to 1, makes TestIPVSCollector fail where the kernel
// has no IPVS instead of skipping: make vagrant-e2e sets it on the
// collector VM (Debian's kernel builds ip_vs as a module, which the IPVS
// generic netlink family loads on first use).
const RequireIPVSEnv = "TIERLIMIT_REQUIRE_IPVS"

// TestIPVSCollector (issue 25 §1; docs/design.md §2, dests: local): a
// collector reached through IPVS, as kube-proxy's IPVS mode builds one,
// is counted and keeps receiving. In the collector's namespace (the
// director) the service address is on a dummy device, as kube-proxy puts
// every service address on kube-ipvs0, and a UDP virtual service on its
// port 514 masquerades to a real server in a third namespace, on port
// 5514. The sender routes the service address through the collector's
// veth, where the program is attached in native mode with the default
// rules, dests: local resolved as the agent resolves it.
//   - Under a policy with room (max 10^6), every datagram to the service
//     is counted as selected and reaches the real server through IPVS.
//   - Under a saturated one (every counted packet dropped), every
//     datagram is dropped at the director and none reaches it.
func TestIPVSCollector(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	rs := testenv.NewNS(t)
	var (
		vip    = netip.MustParseAddr("10.96.0.10") // a ClusterIP-like service address
		dirRS  = netip.MustParsePrefix("10.97.0.1/30")
		rsAddr = netip.MustParsePrefix("10.97.0.2/30")
	)
	const n = 40

	var collIdx int
	if err := p.Coll.Do(func() error {
		var err error
		collIdx, err = setupDirector(p, rs, vip, rsAddr.Addr())
		return err
	}); err != nil {
		if errors.Is(err, errNoIPVS) {
			if os.Getenv(RequireIPVSEnv) == "1" {
				t.Fatalf("IPVS required (%s=1) but unavailable: %v", RequireIPVSEnv, err)
			}
			t.Skipf("skipping: %v (set %s=1 to fail instead)", err, RequireIPVSEnv)
		}
		t.Fatal(err)
	}
	testenv.AddAddr(t, p.Coll, "kube-ipvs0", netip.PrefixFrom(vip, 32))
	testenv.AddAddr(t, p.Coll, "tlrs0", dirRS)
	testenv.AddAddr(t, rs, "tlrs1", rsAddr)
	if err := rs.Do(func() error { return upVia("tlrs1", dirRS.Addr()) }); err != nil {
		t.Fatalf("the real server's veth: %v", err)
	}
	if err := p.Send.Do(func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: p.CollAddr.AsSlice()})
	}); err != nil {
		t.Fatalf("route %v through the collector: %v", vip, err)
	}

	// The director's local destinations, as the agent reads them: the
	// service address on the dummy device among them.
	local := waitLocalDests(t, p.Coll, netip.PrefixFrom(vip, 32))
	room := ordinalDefault()
	room.Window, room.Max = time.Hour, 1_000_000
	h := newHarness(t, room.WithLocal(local))
	attachNative(t, p.Coll, h.l, collIdx)

	rx := testenv.NewReceiver(t, rs, netip.AddrPortFrom(rsAddr.Addr(), 5514))
	tx := testenv.NewSender(t, p.Send, netip.AddrPortFrom(vip, 514))
	send := func(burst int) (selected, dropped uint64) {
		t.Helper()
		s0 := h.stats()
		if _, err := tx.Pace(context.Background(), n, 200*time.Millisecond, 5*time.Second, func(i int) []byte { return testenv.SyslogMessage(burst, i) }); err != nil {
			t.Fatal(err)
		}
		rx.WaitQuiet(300*time.Millisecond, 3*time.Second)
		s1 := h.stats()
		return s1.SelectedPackets() - s0.SelectedPackets(), s1.SelectedTotal(tiers.VerdictDrop).Packets - s0.SelectedTotal(tiers.VerdictDrop).Packets
	}

	if sel, drop := send(0); sel != n || drop != 0 {
		t.Errorf("with room: %d of %d datagrams to the IPVS service counted as selected, %d dropped; want %d and 0", sel, n, drop, n)
	}
	if got, _ := rx.Counts(); got[0] != n {
		t.Errorf("with room: the real server behind IPVS received %d of %d", got[0], n)
	}

	h.apply(saturatedPolicy(local))
	if sel, drop := send(1); sel != n || drop != n {
		t.Errorf("saturated: %d of %d counted, %d dropped; want all of them both", sel, n, drop)
	}
	if got, _ := rx.Counts(); got[1] != 0 {
		t.Errorf("saturated: the real server received %d of the %d datagrams the director dropped", got[1], n)
	}
}

// errNoIPVS: the kernel has no IPVS (no ip_vs, built in or as a module).
var errNoIPVS = errors.New("the kernel has no IPVS (CONFIG_IP_VS)")

// setupDirector, in the collector's namespace: a dummy device kube-ipvs0
// (where kube-proxy puts every service address), a veth tlrs0 to rs (its
// end tlrs1 there), both up, forwarding on, and the UDP virtual service
// vip:514, round robin, masquerading to rsIP:5514. The caller addresses
// the devices. Returns the collector veth's ifindex; errNoIPVS when the
// kernel has no IPVS.
func setupDirector(p *testenv.Pair, rs *testenv.NS, vip, rsIP netip.Addr) (int, error) {
	// The IPVS generic netlink family, asked for by name: the kernel loads
	// ip_vs for it when it is a module. ipvs.New only logs its absence.
	if _, err := netlink.GenlFamilyGet("IPVS"); err != nil {
		return 0, fmt.Errorf("%w: generic netlink family IPVS: %v", errNoIPVS, err)
	}
	h, err := ipvs.New("")
	if err != nil {
		return 0, fmt.Errorf("open IPVS: %w", err)
	}
	defer h.Close()

	dummy := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "kube-ipvs0"}}
	if err := netlink.LinkAdd(dummy); err != nil {
		return 0, fmt.Errorf("add kube-ipvs0: %w", err)
	}
	rsNS, err := netns.GetFromName(rs.Name)
	if err != nil {
		return 0, err
	}
	defer rsNS.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tlrs0"}, PeerName: "tlrs1", PeerNamespace: netlink.NsFd(rsNS)}
	if err := netlink.LinkAdd(veth); err != nil {
		return 0, fmt.Errorf("add the veth to the real server: %w", err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return 0, err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return 0, fmt.Errorf("forwarding on in the director: %w", err)
	}
	svc := &ipvs.Service{Address: vip.AsSlice(), Protocol: syscall.IPPROTO_UDP, Port: 514, SchedName: ipvs.RoundRobin, AddressFamily: syscall.AF_INET, Netmask: 0xffffffff}
	if err := h.NewService(svc); err != nil {
		return 0, fmt.Errorf("add the IPVS service %v:514/udp: %w", vip, err)
	}
	if err := h.NewDestination(svc, &ipvs.Destination{Address: rsIP.AsSlice(), Port: 5514, Weight: 1, ConnectionFlags: ipvs.ConnectionFlagMasq, AddressFamily: syscall.AF_INET}); err != nil {
		return 0, fmt.Errorf("add the real server %v:5514: %w", rsIP, err)
	}
	coll, err := netlink.LinkByName(p.CollIf)
	if err != nil {
		return 0, err
	}
	return coll.Attrs().Index, nil
}

// upVia, in the caller's namespace, sets the link named name up and routes
// everything through gw on it.
func upVia(name string, gw netip.Addr) error {
	lk, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lk); err != nil {
		return err
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: lk.Attrs().Index, Gw: gw.AsSlice()})
}
