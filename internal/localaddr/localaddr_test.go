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
// subnet-router anycast (the namespace forwards), IPv6 multicast and the
// destinations that are always local are not; loopback is left out.
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
		netip.MustParsePrefix("ff00::/8"):           false,
		netip.MustParsePrefix("0.0.0.0/32"):         false,
		netip.MustParsePrefix("255.255.255.255/32"): false,
		netip.MustParsePrefix("224.0.0.0/4"):        false,
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
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if got, err = localaddr.Dests(&netlink.Handle{}); err != nil {
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
}
