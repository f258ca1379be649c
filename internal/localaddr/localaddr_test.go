package localaddr_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/localaddr"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestDests reads a fresh namespace's local routing table: its addresses
// and an AnyIP route are unicast; the subnet broadcast, the IPv6
// subnet-router anycast (the namespace forwards), the multicast groups the
// interfaces have joined (all-nodes, the address's solicited-node group,
// all-hosts) and the destinations that are always local are not; loopback
// is left out, and so is IPv6 multicast whole (ff00::/8). IPv4 multicast
// is listed whole (224.0.0.0/4) only where the kernel cannot list its
// groups (before Linux 6.13), and then all-hosts is not.
func TestDests(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	a4 := p.CollAddr.As4()
	bcast := netip.AddrFrom4([4]byte{a4[0], a4[1], a4[2], 255})
	anycast := netip.PrefixFrom(p.CollAddr6, 64).Masked().Addr()
	anyIP := netip.MustParsePrefix("10.77.0.0/24")
	want := map[netip.Prefix]bool{
		netip.PrefixFrom(p.CollAddr, 32):            true,
		netip.PrefixFrom(p.CollAddr6, 128):          true,
		anyIP:                                       true,
		netip.PrefixFrom(bcast, 32):                 false,
		netip.PrefixFrom(anycast, 128):              false,
		netip.MustParsePrefix("ff02::1/128"):        false,
		solicited(p.CollAddr6):                      false,
		netip.MustParsePrefix("0.0.0.0/32"):         false,
		netip.MustParsePrefix("255.255.255.255/32"): false,
	}
	var got []tiers.LocalDest
	err := p.Coll.Do(func() error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		r := &netlink.Route{Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST, LinkIndex: lo.Attrs().Index,
			Dst: &net.IPNet{IP: anyIP.Addr().AsSlice(), Mask: net.CIDRMask(anyIP.Bits(), 32)}}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("add the AnyIP route: %w", err)
		}
		g, err := localaddr.OpenGroups()
		if err != nil {
			return err
		}
		defer g.Close()
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if got, err = localaddr.Dests(&netlink.Handle{}, g); err != nil {
				return err
			}
			pfx := localaddr.Prefixes(got)
			if slices.Contains(pfx, netip.PrefixFrom(p.CollAddr6, 128)) && slices.Contains(pfx, netip.PrefixFrom(anycast, 128)) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("after 3 s the local table has %v: no IPv6 address or anycast route", got)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Prefix]bool{}
	for i, d := range got {
		if d.Prefix.Addr().IsLoopback() {
			t.Errorf("loopback destination %v listed", d.Prefix)
		}
		if i > 0 && got[i-1].Prefix == d.Prefix {
			t.Errorf("%v listed twice", d.Prefix)
		}
		seen[d.Prefix] = true
		if u, ok := want[d.Prefix]; ok && u != d.Unicast {
			t.Errorf("%v: unicast %v, want %v", d.Prefix, d.Unicast, u)
		}
	}
	for pf := range want {
		if !seen[pf] {
			t.Errorf("%v missing from %v", pf, got)
		}
	}
	if seen[netip.MustParsePrefix("ff00::/8")] {
		t.Errorf("IPv6 multicast listed whole: %v", got)
	}
	if whole, all := seen[netip.MustParsePrefix("224.0.0.0/4")], seen[netip.MustParsePrefix("224.0.0.1/32")]; whole == all {
		t.Errorf("224.0.0.0/4 listed %v, all-hosts 224.0.0.1 %v: want one of them: %v", whole, all, got)
	}
}

// solicited is a's solicited-node multicast group (RFC 4291 §2.7.1).
func solicited(a netip.Addr) netip.Prefix {
	b := a.As16()
	g := netip.MustParseAddr("ff02::1:ff00:0").As16()
	copy(g[13:], b[13:])
	return netip.PrefixFrom(netip.AddrFrom16(g), 128)
}

// TestDestsFollowGroups: a group a socket joins in the namespace is
// listed from then on, as a /128 or /32, and no longer once the socket
// leaves it (closes); a group no one joined never is.
func TestDestsFollowGroups(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	g6, g4 := netip.MustParsePrefix("ff05::514/128"), netip.MustParsePrefix("239.1.2.3/32")
	err := p.Coll.Do(func() error {
		g, err := localaddr.OpenGroups()
		if err != nil {
			return err
		}
		defer g.Close()
		lk, err := netlink.LinkByName(p.CollIf)
		if err != nil {
			return err
		}
		listed := func() (six, four bool, err error) {
			got, err := localaddr.Dests(&netlink.Handle{}, g)
			pfx := localaddr.Prefixes(got)
			return slices.Contains(pfx, g6), slices.Contains(pfx, g4), err
		}
		if six, four, err := listed(); err != nil || six || four {
			return fmt.Errorf("before any join: %v listed %v, %v listed %v (%v)", g6, six, g4, four, err)
		}
		fd6, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		fd4, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			unix.Close(fd6)
			return err
		}
		idx := lk.Attrs().Index
		err = unix.SetsockoptIPv6Mreq(fd6, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, &unix.IPv6Mreq{Multiaddr: g6.Addr().As16(), Interface: uint32(idx)})
		if err == nil {
			err = unix.SetsockoptIPMreqn(fd4, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &unix.IPMreqn{Multiaddr: g4.Addr().As4(), Ifindex: int32(idx)})
		}
		if err != nil {
			unix.Close(fd6)
			unix.Close(fd4)
			return fmt.Errorf("join: %w", err)
		}
		six, four, err := listed()
		unix.Close(fd6)
		unix.Close(fd4)
		if err != nil || !six || !four {
			return fmt.Errorf("joined: %v listed %v, %v listed %v (%v)", g6, six, g4, four, err)
		}
		if six, four, err := listed(); err != nil || six || four {
			return fmt.Errorf("left: %v listed %v, %v listed %v (%v)", g6, six, g4, four, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
