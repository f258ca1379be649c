// Package localaddr lists the destinations a Linux host takes as its own,
// from the local routing table, for select rules with `dests: local`
// (docs/design.md §2). Package agent follows them; bpf's kernel-oracle test
// resolves its policy with them as the agent would.
package localaddr

import (
	"errors"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// Always local, with no route in the local table: the limited broadcast
// (ip_route_input takes it as broadcast on any interface) and 0.0.0.0
// (taken as broadcast from source 0.0.0.0, ip_route_input_slow's
// brd_input; from any other source a martian, which the program does not
// count on an interface the agent describes, bpf/host.h). None is
// unicast.
var always = []tiers.LocalDest{
	{Prefix: netip.MustParsePrefix("0.0.0.0/32")},
	{Prefix: netip.MustParsePrefix("255.255.255.255/32")},
}

// Multicast whole, where the joined groups cannot be read: IPv4's
// without an RTM_GETMULTICAST dump (before Linux 6.13), and both without
// a Groups. A group the host has not joined is then counted, though
// Linux discards it.
var (
	multicast4 = tiers.LocalDest{Prefix: netip.MustParsePrefix("224.0.0.0/4")}
	multicast6 = tiers.LocalDest{Prefix: netip.MustParsePrefix("ff00::/8")}
)

// Dests lists, sorted by prefix, the host's own destinations in the local
// routing table (table 255) that nh sees: where Linux itself decides that
// a packet is for this host (ip_route_input). Every address of every
// interface (a VIP on lo included; an AnyIP route such as `ip route add
// local 10.0.0.0/24 dev lo` as its prefix), the broadcast addresses, and
// the IPv6 anycast routes, with always; and the multicast groups joined
// on some interface, which g (opened in nh's namespace) reads, each as a
// /32 or /128, in place of the IPv6 multicast routes (ff00::/8 on every
// interface) and of 224.0.0.0/4: multicast whole where they cannot be
// read (g nil, or IPv4 before Linux 6.13). A local route (RTN_LOCAL) is
// unicast; broadcast, anycast and multicast ones are not
// (tiers.LocalDest), and a prefix listed as both is unicast. Loopback
// destinations (127.0.0.0/8, ::1) are left out: Linux discards them on any
// other interface as martians (unless route_localnet is set on it).
func Dests(nh *netlink.Handle, g *Groups) ([]tiers.LocalDest, error) {
	routes, err := nh.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(always)
	routes6 := true // the IPv6 multicast routes, for want of its groups
	for _, c := range []struct {
		family uint8
		whole  tiers.LocalDest
	}{{unix.AF_INET, multicast4}, {unix.AF_INET6, multicast6}} {
		var groups []netip.Addr
		if g != nil {
			groups, err = g.Read(c.family)
		}
		switch {
		case g == nil || errors.Is(err, errNoDump):
			if c.family == unix.AF_INET {
				out = append(out, c.whole)
			}
			continue
		case err != nil:
			return nil, err
		}
		for _, a := range groups {
			out = append(out, tiers.LocalDest{Prefix: netip.PrefixFrom(a, a.BitLen())})
		}
		if c.family == unix.AF_INET6 {
			routes6 = false
		}
	}
	for _, r := range routes {
		switch r.Type {
		case unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_ANYCAST:
		case unix.RTN_MULTICAST:
			if !routes6 || r.Family != unix.AF_INET6 {
				continue
			}
		default:
			continue
		}
		if r.Dst == nil {
			continue
		}
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok || a.Unmap().IsLoopback() {
			continue
		}
		bits, _ := r.Dst.Mask.Size()
		out = append(out, tiers.LocalDest{Prefix: netip.PrefixFrom(a.Unmap(), bits).Masked(), Unicast: r.Type == unix.RTN_LOCAL})
	}
	// Unicast first among equal prefixes, so that Compact keeps it.
	slices.SortFunc(out, func(a, b tiers.LocalDest) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		if c := a.Prefix.Bits() - b.Prefix.Bits(); c != 0 {
			return c
		}
		switch {
		case a.Unicast == b.Unicast:
			return 0
		case a.Unicast:
			return -1
		}
		return 1
	})
	return slices.CompactFunc(out, func(a, b tiers.LocalDest) bool { return a.Prefix == b.Prefix }), nil
}

// Prefixes returns the prefixes of ds, in order.
func Prefixes(ds []tiers.LocalDest) []netip.Prefix {
	out := make([]netip.Prefix, len(ds))
	for i, d := range ds {
		out[i] = d.Prefix
	}
	return out
}
