package model

import (
	"encoding/binary"
	"net/netip"

	"github.com/tierlimit/tierlimit/tiers"
)

// Class is how the XDP program treats a frame before any window or tier:
// the reference classifier that the BPF tests compare the program against.
type Class uint8

const (
	// ClassUnselected frames pass untouched and are never counted: not IP,
	// not a selected protocol and port, truncated, or nested deeper than
	// the program parses.
	ClassUnselected Class = iota
	// ClassSelected frames enter the window and may be dropped.
	ClassSelected
	// ClassExempt frames are selected but come from an exempt source:
	// they pass and are counted as exempt, never in the window.
	ClassExempt
	// ClassFragment frames are non-first IP fragments: never counted, they
	// follow the verdict of their first fragment when it was seen.
	ClassFragment
	// ClassMalformed frames have a length field that disagrees with the
	// frame (Classification.Malformed says which). They are counted as
	// malformed, never in the window, and pass, except tiny fragments in
	// enforce mode (MalformedTinyFragment).
	ClassMalformed
)

func (c Class) String() string {
	switch c {
	case ClassUnselected:
		return "unselected"
	case ClassSelected:
		return "selected"
	case ClassExempt:
		return "exempt"
	case ClassFragment:
		return "fragment"
	case ClassMalformed:
		return "malformed"
	}
	return "unknown"
}

// Parser limits, the same as the XDP program's (bpf/consts.h).
const (
	// MaxVLANTags is the most 802.1Q/802.1ad tags parsed (QinQ).
	MaxVLANTags = 2
	// MaxIPv6ExtHeaders is the most IPv6 extension headers walked.
	MaxIPv6ExtHeaders = 6
)

// IP protocol and IPv6 next-header numbers the classifier knows.
const (
	protoHopByHop = 0
	protoTCP      = 6
	protoUDP      = 17
	protoRouting  = 43
	protoFragment = 44
	protoAH       = 51
	protoDestOpts = 60
)

// Classification is what Classify found.
type Classification struct {
	Class Class
	// FirstFragment is set for a frame that is the first fragment of a
	// datagram (offset 0, more fragments follow) and got as far as its L4
	// header.
	FirstFragment bool
	// SYN is set for a TCP segment with SYN and without ACK.
	SYN bool
	// Malformed is the reason of a ClassMalformed frame.
	Malformed tiers.Malformed
	// Deep is set for a frame whose port the program cannot tell
	// (Unclassified says why): when a rule counts it, it is ClassSelected
	// (or ClassExempt) whatever its port.
	Deep         bool
	Unclassified tiers.Unclassified
}

// Drops reports whether the program drops the frame whatever the window:
// a tiny fragment under an enforce policy.
func (c Classification) Drops(p tiers.Policy) bool {
	return c.Class == ClassMalformed && c.Malformed == tiers.MalformedTinyFragment && p.Mode == tiers.ModeEnforce
}

var unselected = Classification{}

func malformed(m tiers.Malformed) *Classification {
	return &Classification{Class: ClassMalformed, Malformed: m}
}

func deep(u tiers.Unclassified) *Classification {
	return &Classification{Deep: true, Unclassified: u}
}

// packet is the parse state: a cursor into frame and what the layers
// below it found.
type packet struct {
	frame []byte
	off   int // the cursor
	// l4len is how many bytes the IP length fields declare from the
	// cursor on.
	l4len    int
	src, dst netip.Addr
	// fragProto is the protocol the fragment declares: IPv4's protocol,
	// the IPv6 fragment header's next header.
	fragProto   byte
	fragOff     uint16 // in 8-byte units
	first, next bool
	v6          bool
	// jumbo: an IPv6 payload length of 0 with a hop-by-hop header first;
	// fragSeen: an IPv6 fragment header was walked.
	jumbo, fragSeen bool
	// isTCP: a TCP segment; tcpSYN: one with SYN and without ACK, RST or
	// FIN.
	isTCP, tcpSYN bool
	// payload: a UDP datagram's payload as the <PRI> is read from it
	// (UDPPayload).
	payload []byte
}

func (pk *packet) has(n int) bool { return len(pk.frame) >= pk.off+n }

// Classify parses an Ethernet frame the way the XDP program does and says
// whether policy p selects it. It is written independently of the program
// (plain byte offsets, no shared code) so that the two can be compared.
//
// Rules, one function per layer: Ethernet with at most MaxVLANTags tags
// (ethernet); IPv4 (ipv4) and IPv6 with its extension headers (ipv6,
// authHeader); a non-first fragment of UDP, TCP or AH (IPv6: destination
// options and routing too) is ClassFragment, or
// a tiny fragment at TCP offset 8; UDP (udp) and TCP (tcp) with their
// length fields; then the select rules and exempt sources (selection).
// A prefix matches addresses of its own family only.
func Classify(p tiers.Policy, frame []byte) Classification {
	return ClassifyOn(p, Iface{}, frame)
}

// UDPPayload returns the payload of frame's UDP datagram as the program
// reads its <PRI> (bpf/severity.h udp_payload; tiers.SyslogSeverity reads
// it): the UDP length less the header, where an IPv6 UDP length of 0 is
// the rest of the IP payload, as __udp6_lib_rcv reads it (docs/design.md
// §7); cut at the frame's end. nil when Classify does not read frame as a
// UDP datagram (not UDP, malformed, or a fragment that follows its first).
func UDPPayload(frame []byte) []byte {
	pk := packet{frame: frame}
	classify(tiers.Policy{}, &pk)
	return pk.payload
}

func classify(p tiers.Policy, pk *packet) Classification {
	etype, stop := pk.ethernet()
	if stop != nil {
		return judgeDeep(p, pk, *stop)
	}
	var l4 int
	switch etype {
	case 0x0800:
		l4, stop = pk.ipv4()
		if stop == nil && l4 == protoAH && !pk.next {
			l4, stop = pk.authHeader(tiers.MalformedIPv4Length)
		}
	case 0x86dd:
		l4, stop = pk.ipv6()
	default:
		return unselected
	}
	if stop != nil {
		if stop.Deep {
			return judgeDeep(p, pk, *stop)
		}
		return *stop
	}
	if pk.next && pk.followsFirst() {
		if l4 == protoTCP && pk.fragOff == 1 {
			return *malformed(tiers.MalformedTinyFragment)
		}
		return Classification{Class: ClassFragment}
	}
	var (
		dport uint16
		syn   bool
		proto tiers.Proto
	)
	switch l4 {
	case protoUDP:
		proto = tiers.ProtoUDP
		dport, stop = pk.udp()
	case protoTCP:
		proto = tiers.ProtoTCP
		dport, syn, stop = pk.tcp()
	default:
		return unselected
	}
	if stop != nil {
		return *stop
	}
	pk.isTCP, pk.tcpSYN = proto == tiers.ProtoTCP, proto == tiers.ProtoTCP && syn
	return selection(p, proto, dport, pk.src, pk.dst, syn, pk.first)
}

// followsFirst reports whether a non-first fragment follows its first:
// one of UDP, TCP or AH, or in IPv6 one whose fragment header names
// destination options or a routing header (bpf/parse.h follows_first).
func (pk *packet) followsFirst() bool {
	switch pk.fragProto {
	case protoUDP, protoTCP, protoAH:
		return true
	case protoDestOpts, protoRouting:
		return pk.v6
	}
	return false
}

// judgeDeep is the class of an unclassified frame c: selected when some
// rule has no dests, or its dests hold the destination, or the frame has
// no L3 header we know (too many VLAN tags); then exempt by its source.
func judgeDeep(p tiers.Policy, pk *packet, c Classification) Classification {
	if !c.Deep {
		return c
	}
	hasL3 := c.Unclassified != tiers.UnclassifiedVLANDepth
	sel := !hasL3
	for _, r := range p.Select {
		if !hasDests(r) {
			sel = true
		}
		for _, d := range append(r.Dests[:len(r.Dests):len(r.Dests)], r.LocalDests...) {
			sel = sel || prefixContains(d, pk.dst)
		}
	}
	if !sel {
		return Classification{FirstFragment: pk.first}
	}
	c.Class, c.FirstFragment = ClassSelected, pk.first
	for _, e := range p.Exempt {
		if hasL3 && prefixContains(e, pk.src) {
			c.Class = ClassExempt
		}
	}
	return c
}

// ethernet skips the Ethernet header and up to MaxVLANTags tags (0x8100,
// 0x88a8) and returns the EtherType of the payload; unselected when
// truncated, deep when more tags follow.
func (pk *packet) ethernet() (uint16, *Classification) {
	if !pk.has(14) {
		return 0, &unselected
	}
	etype := binary.BigEndian.Uint16(pk.frame[12:])
	pk.off = 14
	for range MaxVLANTags {
		if etype != 0x8100 && etype != 0x88a8 {
			return etype, nil
		}
		if !pk.has(4) {
			return 0, &unselected
		}
		etype = binary.BigEndian.Uint16(pk.frame[pk.off+2:])
		pk.off += 4
	}
	if etype == 0x8100 || etype == 0x88a8 {
		return 0, deep(tiers.UnclassifiedVLANDepth)
	}
	return etype, nil
}

// ipv4HeaderSumOK reports whether the IPv4 header h verifies: its
// 16-bit one's complement sum is 0xffff.
func ipv4HeaderSumOK(h []byte) bool {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return sum == 0xffff
}

// ipv4: version 4, IHL >= 5 and the header with options in the frame, or
// unselected; a header checksum that verifies, then a total length from
// IHL × 4 to the end of the frame, or malformed. Returns the protocol.
// (The program also reads a total length of 0 on a TCP super-packet as
// the rest of it, as iph_totlen does for BIG TCP: a frame alone, as
// classified here, is never one.)
func (pk *packet) ipv4() (int, *Classification) {
	if !pk.has(20) {
		return -1, &unselected
	}
	ip := pk.frame[pk.off:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < 20 || !pk.has(ihl) {
		return -1, &unselected
	}
	if !ipv4HeaderSumOK(ip[:ihl]) {
		return -1, malformed(tiers.MalformedIPv4Checksum)
	}
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if tot < ihl || !pk.has(tot) {
		return -1, malformed(tiers.MalformedIPv4Length)
	}
	frag := binary.BigEndian.Uint16(ip[6:])
	pk.fragOff = frag & 0x1fff
	pk.next = pk.fragOff != 0
	pk.first = !pk.next && frag&0x2000 != 0
	pk.fragProto = ip[9]
	pk.src = netip.AddrFrom4([4]byte(ip[12:16]))
	pk.dst = netip.AddrFrom4([4]byte(ip[16:20]))
	pk.off += ihl
	pk.l4len = tot - ihl
	return int(ip[9]), nil
}

// shortL4 is an L4 header cut by the IP length: a tiny fragment in a first
// fragment, else malformed for reason.
func (pk *packet) shortL4(reason tiers.Malformed) *Classification {
	if pk.first {
		return malformed(tiers.MalformedTinyFragment)
	}
	return malformed(reason)
}

// udp: 8 bytes of IP payload, a UDP length of at least 8 (IPv6: 0 is the
// rest of the payload) and, except in a first fragment, within the IP
// payload. Returns the destination port.
func (pk *packet) udp() (uint16, *Classification) {
	if pk.l4len < 8 {
		return 0, pk.shortL4(tiers.MalformedUDPLength)
	}
	if !pk.has(8) {
		return 0, &unselected
	}
	h := pk.frame[pk.off:]
	ulen := int(binary.BigEndian.Uint16(h[4:]))
	// __udp6_lib_rcv reads an IPv6 UDP length of 0 as the rest of the
	// packet (a jumbogram's); udp_rcv (IPv4) discards it.
	if ulen == 0 && pk.v6 {
		ulen = pk.l4len
	}
	if ulen < 8 || (ulen > pk.l4len && !pk.first) {
		return 0, malformed(tiers.MalformedUDPLength)
	}
	pk.payload = h[8:min(ulen, len(h))]
	return binary.BigEndian.Uint16(h[2:]), nil
}

// tcp: to the interface's MAC, not a broadcast or multicast one (TCP
// discards those), or unselected; 20 bytes of IP payload, a data offset
// of at least 5 whose header fits the IP payload. Returns the destination
// port and whether the segment is a SYN without ACK. A first fragment is
// judged whatever its MAC: the kernel reassembles it first.
func (pk *packet) tcp() (uint16, bool, *Classification) {
	if pk.frame[0]&1 != 0 && !pk.first {
		return 0, false, &unselected
	}
	if pk.l4len < 20 {
		return 0, false, pk.shortL4(tiers.MalformedTCPLength)
	}
	if !pk.has(20) {
		return 0, false, &unselected
	}
	h := pk.frame[pk.off:]
	doff := int(h[12]>>4) * 4
	if doff < 20 {
		return 0, false, malformed(tiers.MalformedTCPLength)
	}
	if doff > pk.l4len {
		return 0, false, pk.shortL4(tiers.MalformedTCPLength)
	}
	if !pk.has(doff) {
		return 0, false, &unselected
	}
	// A connection attempt: SYN without ACK, and without RST or FIN,
	// which make a listener discard it (tcp_rcv_state_process).
	flags := h[13]
	return binary.BigEndian.Uint16(h[2:]), flags&0x02 != 0 && flags&0x17 == 0x02, nil
}

// selection applies the select rules and exempt sources to a parsed
// packet: a rule matches protocol, destination port and, when it has
// dests, destination address; count: syn rules match only SYN without ACK.
func selection(p tiers.Policy, proto tiers.Proto, dport uint16, src, dst netip.Addr, syn, first bool) Classification {
	if !selects(p, proto, dport, dst, syn) {
		return Classification{FirstFragment: first}
	}
	c := Classification{Class: ClassSelected, FirstFragment: first, SYN: syn}
	for _, e := range p.Exempt {
		if prefixContains(e, src) {
			c.Class = ClassExempt
			break
		}
	}
	return c
}

// selects reports whether any rule counts a packet to (proto, dport, dst).
func selects(p tiers.Policy, proto tiers.Proto, dport uint16, dst netip.Addr, syn bool) bool {
	for _, r := range p.Select {
		if r.Proto != proto || (r.Count == tiers.CountSYN && !syn) {
			continue
		}
		inPorts := false
		for _, pr := range r.Ports {
			if dport >= pr.First && dport <= pr.Last {
				inPorts = true
				break
			}
		}
		if !inPorts {
			continue
		}
		if !hasDests(r) {
			return true
		}
		for _, d := range append(r.Dests[:len(r.Dests):len(r.Dests)], r.LocalDests...) {
			if prefixContains(d, dst) {
				return true
			}
		}
	}
	return false
}

// hasDests reports whether rule r matches some destinations only (Dests
// or LocalDests).
func hasDests(r tiers.Rule) bool { return len(r.Dests) > 0 || len(r.LocalDests) > 0 }

// prefixContains matches the way the program's LPM tries do: an IPv4
// prefix only IPv4 addresses, an IPv6 prefix only IPv6 ones, including
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) of IPv6 packets. This is
// netip.Prefix.Contains.
func prefixContains(pfx netip.Prefix, a netip.Addr) bool {
	return pfx.Contains(a)
}
