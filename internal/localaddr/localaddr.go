// Package localaddr lists the destinations a Linux host takes as its own,
// from the local routing table, for select rules with `dests: local`
// (docs/design.md §2). Package agent follows them; bpf's kernel-oracle test
// resolves its policy with them as the agent would.
package localaddr

import (
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// Always local, with no route in the local table: the limited broadcast
// (ip_route_input takes it as broadcast on any interface), 0.0.0.0 (taken
// as broadcast from source 0.0.0.0, ip_route_input_slow's brd_input; from
// any other source a martian, which the program does not count on an
// interface the agent describes, bpf/host.h) and IPv4 multicast, whole (a
// group the host has not joined is counted, though Linux discards it).
// None is unicast.
var always = []tiers.LocalDest{
	{Prefix: netip.MustParsePrefix("0.0.0.0/32")},
	{Prefix: netip.MustParsePrefix("255.255.255.255/32")},
	{Prefix: netip.MustParsePrefix("224.0.0.0/4")},
}

// Dests lists, sorted by prefix, the host's own destinations in the local
// routing table (table 255) that nh sees: where Linux itself decides that
// a packet is for this host (ip_route_input). Every address of every
// interface (a VIP on lo included; an AnyIP route such as `ip route add
// local 10.0.0.0/24 dev lo` as its prefix), the broadcast addresses, and
// the IPv6 anycast and multicast routes, with always. A local route
// (RTN_LOCAL) is unicast; broadcast, anycast and multicast ones are not
// (tiers.LocalDest), and a prefix listed as both is unicast. Loopback
// destinations (127.0.0.0/8, ::1) are left out: Linux discards them on any
// other interface as martians (unless route_localnet is set on it).
func Dests(nh *netlink.Handle) ([]tiers.LocalDest, error) {
	routes, err := nh.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(always)
	for _, r := range routes {
		switch r.Type {
		case unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_ANYCAST, unix.RTN_MULTICAST:
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
