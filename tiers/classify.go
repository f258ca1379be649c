package tiers

import (
	"encoding/binary"
	"net/netip"
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

// Malformed is why a frame is ClassMalformed. The values mirror
// bpf/types.h enum tl_malformed (bpf's TestContract checks them) and index
// the program's malformed_stats map.
type Malformed uint8

const (
	// MalformedIPv4Length: IPv4 total length below IHL × 4 or past the frame.
	MalformedIPv4Length Malformed = iota
	// MalformedIPv6Length: IPv6 payload length past the frame, or shorter
	// than the extension headers it holds.
	MalformedIPv6Length
	// MalformedUDPLength: UDP length below 8 or (except in a first
	// fragment) past the IP payload, or an IP payload shorter than 8.
	MalformedUDPLength
	// MalformedTCPLength: TCP data offset below 5 or past the IP payload,
	// or an IP payload shorter than 20.
	MalformedTCPLength
	// MalformedTinyFragment: RFC 1858. A first fragment too short for its
	// UDP or TCP header, or a TCP fragment at offset 8 bytes. Dropped in
	// enforce mode whatever its port; passed in dry-run and off.
	MalformedTinyFragment
	// NumMalformed is the number of reasons.
	NumMalformed
)

// MalformedReasons lists every reason, in order.
var MalformedReasons = []Malformed{MalformedIPv4Length, MalformedIPv6Length, MalformedUDPLength, MalformedTCPLength, MalformedTinyFragment}

// String is the reason's metric label: ipv4_length, ipv6_length,
// udp_length, tcp_length or tiny_fragment.
func (m Malformed) String() string {
	switch m {
	case MalformedIPv4Length:
		return "ipv4_length"
	case MalformedIPv6Length:
		return "ipv6_length"
	case MalformedUDPLength:
		return "udp_length"
	case MalformedTCPLength:
		return "tcp_length"
	case MalformedTinyFragment:
		return "tiny_fragment"
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
	Malformed Malformed
}

// Drops reports whether the program drops the frame whatever the window:
// a tiny fragment under an enforce policy.
func (c Classification) Drops(p Policy) bool {
	return c.Class == ClassMalformed && c.Malformed == MalformedTinyFragment && p.Mode == ModeEnforce
}

var unselected = Classification{}

func malformed(m Malformed) *Classification {
	return &Classification{Class: ClassMalformed, Malformed: m}
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
}

func (pk *packet) has(n int) bool { return len(pk.frame) >= pk.off+n }

// Classify parses an Ethernet frame the way the XDP program does and says
// whether policy p selects it. It is written independently of the program
// (plain byte offsets, no shared code) so that the two can be compared.
//
// Rules, one function per layer: Ethernet with at most MaxVLANTags tags
// (ethernet); IPv4 (ipv4) and IPv6 with its extension headers (ipv6,
// authHeader); a non-first fragment of UDP, TCP or AH is ClassFragment, or
// a tiny fragment at TCP offset 8; UDP (udp) and TCP (tcp) with their
// length fields; then the select rules and exempt sources (selection).
// A prefix matches addresses of its own family only.
func Classify(p Policy, frame []byte) Classification {
	pk := packet{frame: frame}
	etype, ok := pk.ethernet()
	if !ok {
		return unselected
	}
	var (
		l4   int
		stop *Classification
	)
	switch etype {
	case 0x0800:
		l4, stop = pk.ipv4()
		if stop == nil && l4 == protoAH && !pk.next {
			l4, stop = pk.authHeader(MalformedIPv4Length)
		}
	case 0x86dd:
		l4, stop = pk.ipv6()
	default:
		return unselected
	}
	if stop != nil {
		return *stop
	}
	if pk.next && (pk.fragProto == protoUDP || pk.fragProto == protoTCP || pk.fragProto == protoAH) {
		if l4 == protoTCP && pk.fragOff == 1 {
			return *malformed(MalformedTinyFragment)
		}
		return Classification{Class: ClassFragment}
	}
	var (
		dport uint16
		syn   bool
		proto Proto
	)
	switch l4 {
	case protoUDP:
		proto = ProtoUDP
		dport, stop = pk.udp()
	case protoTCP:
		proto = ProtoTCP
		dport, syn, stop = pk.tcp()
	default:
		return unselected
	}
	if stop != nil {
		return *stop
	}
	return p.selection(proto, dport, pk.src, pk.dst, syn, pk.first)
}

// ethernet skips the Ethernet header and up to MaxVLANTags tags (0x8100,
// 0x88a8) and returns the EtherType of the payload.
func (pk *packet) ethernet() (uint16, bool) {
	if !pk.has(14) {
		return 0, false
	}
	etype := binary.BigEndian.Uint16(pk.frame[12:])
	pk.off = 14
	for range MaxVLANTags {
		if etype != 0x8100 && etype != 0x88a8 {
			return etype, true
		}
		if !pk.has(4) {
			return 0, false
		}
		etype = binary.BigEndian.Uint16(pk.frame[pk.off+2:])
		pk.off += 4
	}
	return etype, etype != 0x8100 && etype != 0x88a8
}

// ipv4: version 4, IHL >= 5 and the header with options in the frame, or
// unselected; total length from IHL × 4 to the end of the frame, or
// malformed. Returns the protocol.
func (pk *packet) ipv4() (int, *Classification) {
	if !pk.has(20) {
		return -1, &unselected
	}
	ip := pk.frame[pk.off:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < 20 || !pk.has(ihl) {
		return -1, &unselected
	}
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if tot < ihl || !pk.has(tot) {
		return -1, malformed(MalformedIPv4Length)
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

// isIPv6Ext reports whether the program walks next-header value nh:
// hop-by-hop, routing, fragment, AH and destination options. ESP,
// Mobility, HIP, Shim6, 253, 254 and the rest end the walk (bpf/parse.h
// ipv6_is_ext says why).
func isIPv6Ext(nh int) bool {
	return nh == protoHopByHop || nh == protoRouting || nh == protoFragment || nh == protoAH || nh == protoDestOpts
}

// ipv6: the fixed header and its payload length (past the frame:
// malformed), then at most MaxIPv6ExtHeaders extension headers, each
// within the payload length. Returns the upper-layer protocol; stops at a
// non-first fragment with its next header.
func (pk *packet) ipv6() (int, *Classification) {
	if !pk.has(40) {
		return -1, &unselected
	}
	ip := pk.frame[pk.off:]
	if ip[0]>>4 != 6 {
		return -1, &unselected
	}
	pk.src = netip.AddrFrom16([16]byte(ip[8:24]))
	pk.dst = netip.AddrFrom16([16]byte(ip[24:40]))
	nh := int(ip[6])
	pk.off += 40
	pk.l4len = int(binary.BigEndian.Uint16(ip[4:]))
	if !pk.has(pk.l4len) {
		return -1, malformed(MalformedIPv6Length)
	}
	for range MaxIPv6ExtHeaders {
		switch nh {
		case protoFragment:
			if !pk.has(8) {
				return -1, &unselected
			}
			if pk.l4len < 8 {
				return -1, malformed(MalformedIPv6Length)
			}
			fo := binary.BigEndian.Uint16(pk.frame[pk.off+2:])
			nh = int(pk.frame[pk.off])
			pk.fragProto = byte(nh)
			pk.fragOff = fo >> 3
			pk.off += 8
			pk.l4len -= 8
			if fo&0xfff8 != 0 {
				pk.next = true
				return nh, nil
			}
			pk.first = fo&1 != 0
		case protoAH:
			var stop *Classification
			if nh, stop = pk.authHeader(MalformedIPv6Length); stop != nil {
				return -1, stop
			}
		case protoHopByHop, protoRouting, protoDestOpts:
			if !pk.has(2) {
				return -1, &unselected
			}
			size := (int(pk.frame[pk.off+1]) + 1) * 8
			if size > pk.l4len {
				return -1, malformed(MalformedIPv6Length)
			}
			nh = int(pk.frame[pk.off])
			if !pk.has(size) {
				return -1, &unselected
			}
			pk.off += size
			pk.l4len -= size
		default:
			return nh, nil
		}
	}
	if isIPv6Ext(nh) {
		return -1, &unselected
	}
	return nh, nil
}

// authHeader walks an Authentication Header (RFC 4302): 12 bytes in the
// frame, its length ((len + 2) × 4) within the IP payload or malformed for
// reason. Returns its next header.
func (pk *packet) authHeader(reason Malformed) (int, *Classification) {
	if !pk.has(12) {
		return -1, &unselected
	}
	size := (int(pk.frame[pk.off+1]) + 2) * 4
	if size > pk.l4len {
		return -1, malformed(reason)
	}
	nh := int(pk.frame[pk.off])
	if !pk.has(size) {
		return -1, &unselected
	}
	pk.off += size
	pk.l4len -= size
	return nh, nil
}

// shortL4 is an L4 header cut by the IP length: a tiny fragment in a first
// fragment, else malformed for reason.
func (pk *packet) shortL4(reason Malformed) *Classification {
	if pk.first {
		return malformed(MalformedTinyFragment)
	}
	return malformed(reason)
}

// udp: 8 bytes of IP payload, a UDP length of at least 8 and, except in a
// first fragment, within the IP payload. Returns the destination port.
func (pk *packet) udp() (uint16, *Classification) {
	if pk.l4len < 8 {
		return 0, pk.shortL4(MalformedUDPLength)
	}
	if !pk.has(8) {
		return 0, &unselected
	}
	h := pk.frame[pk.off:]
	ulen := int(binary.BigEndian.Uint16(h[4:]))
	if ulen < 8 || (ulen > pk.l4len && !pk.first) {
		return 0, malformed(MalformedUDPLength)
	}
	return binary.BigEndian.Uint16(h[2:]), nil
}

// tcp: 20 bytes of IP payload, a data offset of at least 5 whose header
// fits the IP payload. Returns the destination port and whether the
// segment is a SYN without ACK.
func (pk *packet) tcp() (uint16, bool, *Classification) {
	if pk.l4len < 20 {
		return 0, false, pk.shortL4(MalformedTCPLength)
	}
	if !pk.has(20) {
		return 0, false, &unselected
	}
	h := pk.frame[pk.off:]
	doff := int(h[12]>>4) * 4
	if doff < 20 {
		return 0, false, malformed(MalformedTCPLength)
	}
	if doff > pk.l4len {
		return 0, false, pk.shortL4(MalformedTCPLength)
	}
	if !pk.has(doff) {
		return 0, false, &unselected
	}
	flags := h[13]
	return binary.BigEndian.Uint16(h[2:]), flags&0x02 != 0 && flags&0x10 == 0, nil
}

// selection applies the select rules and exempt sources to a parsed
// packet: a rule matches protocol, destination port and, when it has
// dests, destination address; count: syn rules match only SYN without ACK.
func (p Policy) selection(proto Proto, dport uint16, src, dst netip.Addr, syn, first bool) Classification {
	if !p.selects(proto, dport, dst, syn) {
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
func (p Policy) selects(proto Proto, dport uint16, dst netip.Addr, syn bool) bool {
	for _, r := range p.Select {
		if r.Proto != proto || (r.Count == CountSYN && !syn) {
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
		if len(r.Dests) == 0 {
			return true
		}
		for _, d := range r.Dests {
			if prefixContains(d, dst) {
				return true
			}
		}
	}
	return false
}

// prefixContains matches the way the program's LPM tries do: an IPv4
// prefix only IPv4 addresses, an IPv6 prefix only IPv6 ones, including
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) of IPv6 packets. This is
// netip.Prefix.Contains.
func prefixContains(pfx netip.Prefix, a netip.Addr) bool {
	return pfx.Contains(a)
}
