package bpf_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/localaddr"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// RequireIPVSEnv, set to 1, makes TestIPVSCollector fail where the kernel
// has no IPVS instead of skipping: make vagrant-e2e sets it on the
// collector VM (Debian's kernel builds ip_vs as a module, which the IPVS
// generic netlink family loads on first use).
const RequireIPVSEnv = "TIERLIMIT_REQUIRE_IPVS"

// TestIPVSCollector (issue 25 §1; DESIGN.md §2, dests: local): a
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
		collIdx, err = setupDirector(p, rs, vip, dirRS, rsAddr.Addr())
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
	if err := rs.Do(func() error { return setupRealServer(rs, rsAddr, dirRS.Addr()) }); err != nil {
		t.Fatal(err)
	}
	if err := p.Send.Do(func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: netipNet(netip.PrefixFrom(vip, 32)), Gw: p.CollAddr.AsSlice()})
	}); err != nil {
		t.Fatalf("route %v through the collector: %v", vip, err)
	}

	// The director's local destinations, as the agent reads them: the
	// service address on the dummy device among them.
	var local []tiers.LocalDest
	if err := p.Coll.Do(func() (err error) {
		local, err = localaddr.Dests(&netlink.Handle{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(localaddr.Prefixes(local), netip.PrefixFrom(vip, 32)) {
		t.Fatalf("the director's local destinations %v lack the service address %v on its dummy device", localaddr.Prefixes(local), vip)
	}

	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	room := ordinalDefault()
	room.Window, room.Max = time.Hour, 1_000_000
	apply := func(pol tiers.Policy) {
		t.Helper()
		tab, err := tiers.Compile(pol)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Apply(pol, tab); err != nil {
			t.Fatal(err)
		}
	}
	apply(room.WithLocal(local))
	if err := p.Coll.Do(func() error {
		lk, err := link.AttachXDP(link.XDPOptions{Program: l.Program(), Interface: collIdx, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { lk.Close() })
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	rx := testenv.NewReceiver(t, rs, netip.AddrPortFrom(rsAddr.Addr(), 5514))
	tx := testenv.NewSender(t, p.Send, netip.AddrPortFrom(vip, 514))
	stats := func() bpf.Stats {
		t.Helper()
		st, err := l.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	send := func(burst int) (selected, dropped uint64) {
		t.Helper()
		s0 := stats()
		if _, err := tx.Pace(context.Background(), n, 200*time.Millisecond, 5*time.Second, func(i int) []byte { return testenv.SyslogMessage(burst, i) }); err != nil {
			t.Fatal(err)
		}
		rx.WaitQuiet(300*time.Millisecond, 3*time.Second)
		s1 := stats()
		return s1.SelectedPackets() - s0.SelectedPackets(), s1.SelectedTotal(tiers.VerdictDrop).Packets - s0.SelectedTotal(tiers.VerdictDrop).Packets
	}

	if sel, drop := send(0); sel != n || drop != 0 {
		t.Errorf("with room: %d of %d datagrams to the IPVS service counted as selected, %d dropped; want %d and 0", sel, n, drop, n)
	}
	if got, _ := rx.Counts(); got[0] != n {
		t.Errorf("with room: the real server behind IPVS received %d of %d", got[0], n)
	}

	apply(saturatedPolicy(local))
	if sel, drop := send(1); sel != n || drop != n {
		t.Errorf("saturated: %d of %d counted, %d dropped; want all of them both", sel, n, drop)
	}
	if got, _ := rx.Counts(); got[1] != 0 {
		t.Errorf("saturated: the real server received %d of the %d datagrams the director dropped", got[1], n)
	}
}

// errNoIPVS: the kernel has no IPVS (no ip_vs, built in or as a module).
var errNoIPVS = errors.New("the kernel has no IPVS (CONFIG_IP_VS)")

// setupDirector, in the collector's namespace: vip on a dummy device
// (kube-ipvs0, as kube-proxy does), a veth to rs with dirRS on this side,
// forwarding on, and the UDP virtual service vip:514, round robin,
// masquerading to rsIP:5514. Returns the collector veth's ifindex.
func setupDirector(p *testenv.Pair, rs *testenv.NS, vip netip.Addr, dirRS netip.Prefix, rsIP netip.Addr) (int, error) {
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
	if err := netlink.AddrAdd(dummy, &netlink.Addr{IPNet: netipNet(netip.PrefixFrom(vip, 32))}); err != nil {
		return 0, fmt.Errorf("put %v on kube-ipvs0: %w", vip, err)
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
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: netipNet(dirRS)}); err != nil {
		return 0, err
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

// setupRealServer, in rs: its end of the veth with addr, up, and the
// director as its default gateway.
func setupRealServer(rs *testenv.NS, addr netip.Prefix, gw netip.Addr) error {
	lk, err := netlink.LinkByName("tlrs1")
	if err != nil {
		return fmt.Errorf("the real server's veth in %s: %w", rs.Name, err)
	}
	if err := netlink.AddrAdd(lk, &netlink.Addr{IPNet: netipNet(addr)}); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lk); err != nil {
		return err
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: lk.Attrs().Index, Gw: gw.AsSlice()})
}

func netipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
