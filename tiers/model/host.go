package model

import (
	"bytes"
	"encoding/binary"
	"net/netip"

	"github.com/tierlimit/tierlimit/tiers"
)

// Iface describes the interface a frame arrives on, as the agent describes
// it to the XDP program (bpf.Iface): which frames Linux certainly discards
// there before any socket sees them (docs/design.md §2, "The kernel is the
// oracle"). The zero Iface checks nothing.
type Iface struct {
	MAC [6]byte
	// CheckMAC: a unicast destination MAC other than MAC is another host's
	// (eth_type_trans: PACKET_OTHERHOST, which ip_rcv_core and
	// ip6_rcv_core discard), and so is a frame with a VLAN tag whose VID
	// is not 0: no VLAN device sits on the interface.
	CheckMAC bool
	// Martians: the IPv4 and IPv6 addresses the kernel always discards on
	// a device that is not loopback nor an L3 master.
	Martians bool
	// LocalnetMartian: 127.0.0.0/8 as well (route_localnet off).
	LocalnetMartian bool
}

// ClassifyOn is Classify for a frame arriving on an interface described by
// ifc: a frame the policy selects but Linux certainly discards there is
// unselected.
func ClassifyOn(p tiers.Policy, ifc Iface, frame []byte) Classification {
	pk := packet{frame: frame}
	c := classify(p, &pk)
	if (c.Class == ClassSelected || c.Class == ClassExempt) && ifc.discards(&pk, c) {
		return Classification{FirstFragment: c.FirstFragment}
	}
	return c
}

// discards reports whether Linux discards the parsed frame pk, of class c,
// on ifc: bpf/host.h kernel_discards, written independently.
func (ifc Iface) discards(pk *packet, c Classification) bool {
	f := pk.frame
	if ifc.CheckMAC && len(f) >= 6 && f[0]&1 == 0 && !bytes.Equal(f[:6], ifc.MAC[:]) {
		return true
	}
	if ifc.CheckMAC && vlanOtherHost(f) {
		return true
	}
	if !ifc.Martians || (c.Deep && c.Unclassified == tiers.UnclassifiedVLANDepth) || !pk.src.IsValid() {
		return false
	}
	tcp := pk.isTCP && !c.Deep
	if !pk.v6 {
		return martian4(pk.src, pk.dst, ifc.LocalnetMartian, tcp)
	}
	return martian6(pk.src, pk.dst, tcp, pk.tcpSYN && !c.Deep)
}

// vlanOtherHost reports whether one of the first MaxVLANTags VLAN tags of
// f has a nonzero VID, which, with no VLAN device on the interface (no
// device sits on one that CheckMAC describes), makes the kernel mark the
// frame PACKET_OTHERHOST (__netif_receive_skb_core, vlan_do_receive); a
// VID 0 tag is stripped and the next one looked at.
func vlanOtherHost(f []byte) bool {
	for i := range MaxVLANTags {
		at := 12 + 4*i
		if len(f) < at+4 {
			return false
		}
		if et := binary.BigEndian.Uint16(f[at:]); et != 0x8100 && et != 0x88a8 {
			return false
		}
		if binary.BigEndian.Uint16(f[at+2:])&0x0fff != 0 {
			return true
		}
	}
	return false
}

var (
	loopback4   = netip.MustParsePrefix("127.0.0.0/8")
	multicast4  = netip.MustParsePrefix("224.0.0.0/4")
	localMcast4 = netip.MustParsePrefix("224.0.0.0/24")
	broadcast4  = netip.MustParseAddr("255.255.255.255")
	zero4       = netip.MustParseAddr("0.0.0.0")
	mapped6     = netip.MustParsePrefix("::ffff:0:0/96")
)

// martian4 is the kernel's IPv4 input routing (net/ipv4/route.c
// ip_route_input_slow, ip_route_input_mc, ip_mc_validate_source) on UDP
// and TCP, with the sysctls it does not read taken at any value and
// route_localnet off when localnet; and for TCP, a broadcast or multicast
// destination (tcp_v4_conn_request). Its "zeronet" is 0.0.0.0 alone
// (Linux 5.3 and later: 0.0.0.0/8 is unicast space).
func martian4(s, d netip.Addr, localnet, tcp bool) bool {
	if multicast4.Contains(s) || s == broadcast4 {
		return true
	}
	if d == broadcast4 || (s == zero4 && d == zero4) {
		return tcp
	}
	sLo := localnet && loopback4.Contains(s)
	if multicast4.Contains(d) {
		return tcp || sLo || (s == zero4 && !localMcast4.Contains(d))
	}
	return s == zero4 || d == zero4 || sLo || (localnet && loopback4.Contains(d))
}

// martian6 is ip6_rcv_core (net/ipv6/ip6_input.c) on a device that is not
// loopback: ::1 as either address, a multicast source, a multicast
// destination of scope 0 or 1; and TCP to a multicast destination, or a
// SYN from an IPv4-mapped source, which tcp_v6_conn_request discards.
func martian6(s, d netip.Addr, tcp, syn bool) bool {
	// netip's IsLoopback and IsMulticast unmap IPv4-mapped addresses,
	// which the kernel does not: the bytes decide.
	sb, db := s.As16(), d.As16()
	if sb[0] == 0xff || sb == loopback6 || db == loopback6 {
		return true
	}
	if db[0] == 0xff && db[1]&0x0f <= 1 {
		return true
	}
	return tcp && (db[0] == 0xff || (syn && mapped6.Contains(s)))
}

var loopback6 = netip.IPv6Loopback().As16()
