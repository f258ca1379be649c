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
	// not a selected protocol and port, malformed, truncated, or nested
	// deeper than the program parses.
	ClassUnselected Class = iota
	// ClassSelected frames enter the window and may be dropped.
	ClassSelected
	// ClassExempt frames are selected but come from an exempt source:
	// they pass and are counted as exempt, never in the window.
	ClassExempt
	// ClassFragment frames are non-first IP fragments: never counted, they
	// follow the verdict of their first fragment when it was seen.
	ClassFragment
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

// Classification is what Classify found.
type Classification struct {
	Class Class
	// FirstFragment is set for a selected or exempt frame that is the first
	// fragment of a datagram (offset 0, more fragments follow).
	FirstFragment bool
	// SYN is set for a TCP segment with SYN and without ACK.
	SYN bool
}

// Classify parses an Ethernet frame the way the XDP program does and says
// whether policy p selects it. It is written independently of the program
// (plain byte offsets, no shared code) so that the two can be compared.
//
// Rules: Ethernet, at most MaxVLANTags tags (0x8100, 0x88a8); IPv4 with
// version 4, IHL >= 5, total length >= IHL*4 and the header with options in
// the frame; IPv6 with at most MaxIPv6ExtHeaders hop-by-hop, routing,
// destination-options and fragment headers (RFC 8200 §4); a non-first
// fragment is ClassFragment if its protocol is UDP or TCP; UDP needs 8 bytes,
// TCP needs data offset >= 5 and all of its header in the frame. A rule
// matches protocol, destination port and, when it has dests, destination
// address; count: syn rules match only SYN without ACK.
func Classify(p Policy, frame []byte) Classification {
	var none Classification
	if len(frame) < 14 {
		return none
	}
	etype := binary.BigEndian.Uint16(frame[12:])
	off := 14
	for range MaxVLANTags {
		if etype != 0x8100 && etype != 0x88a8 {
			break
		}
		if len(frame) < off+4 {
			return none
		}
		etype = binary.BigEndian.Uint16(frame[off+2:])
		off += 4
	}

	var (
		src, dst netip.Addr
		l4       byte
		first    bool
		next     bool
	)
	switch etype {
	case 0x0800:
		if len(frame) < off+20 {
			return none
		}
		ip := frame[off:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[0]>>4 != 4 || ihl < 20 || int(binary.BigEndian.Uint16(ip[2:])) < ihl || len(ip) < ihl {
			return none
		}
		frag := binary.BigEndian.Uint16(ip[6:])
		next = frag&0x1fff != 0
		first = !next && frag&0x2000 != 0
		l4 = ip[9]
		src = netip.AddrFrom4([4]byte(ip[12:16]))
		dst = netip.AddrFrom4([4]byte(ip[16:20]))
		off += ihl
	case 0x86dd:
		if len(frame) < off+40 {
			return none
		}
		ip := frame[off:]
		if ip[0]>>4 != 6 {
			return none
		}
		src = netip.AddrFrom16([16]byte(ip[8:24]))
		dst = netip.AddrFrom16([16]byte(ip[24:40]))
		l4 = ip[6]
		off += 40
		walked := 0
	walk:
		for ; isIPv6Ext(l4); walked++ {
			if walked == MaxIPv6ExtHeaders {
				return none
			}
			switch l4 {
			case 44: // fragment
				if len(frame) < off+8 {
					return none
				}
				fo := binary.BigEndian.Uint16(frame[off+2:])
				l4 = frame[off]
				off += 8
				if fo&0xfff8 != 0 {
					next = true
					break walk
				}
				first = fo&1 != 0
			default:
				if len(frame) < off+2 {
					return none
				}
				size := (int(frame[off+1]) + 1) * 8
				l4 = frame[off]
				if len(frame) < off+size {
					return none
				}
				off += size
			}
		}
	default:
		return none
	}

	var proto Proto
	switch l4 {
	case 6:
		proto = ProtoTCP
	case 17:
		proto = ProtoUDP
	default:
		return none
	}
	if next {
		return Classification{Class: ClassFragment}
	}

	var (
		dport uint16
		syn   bool
	)
	if proto == ProtoUDP {
		if len(frame) < off+8 {
			return none
		}
		dport = binary.BigEndian.Uint16(frame[off+2:])
	} else {
		if len(frame) < off+20 {
			return none
		}
		doff := int(frame[off+12]>>4) * 4
		if doff < 20 || len(frame) < off+doff {
			return none
		}
		dport = binary.BigEndian.Uint16(frame[off+2:])
		flags := frame[off+13]
		syn = flags&0x02 != 0 && flags&0x10 == 0
	}

	if !p.selects(proto, dport, dst, syn) {
		return none
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

func isIPv6Ext(nh byte) bool {
	return nh == 0 || nh == 43 || nh == 44 || nh == 60
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

// prefixContains matches the way the program's LPM tries do: both sides as
// 16 bytes, IPv4 as IPv4-mapped IPv6 (RFC 4291 §2.5.5.2). So an IPv6 prefix
// covering ::ffff:0:0/96 also matches IPv4, and an IPv4 prefix also matches
// an IPv6 address that is IPv4-mapped.
func prefixContains(pfx netip.Prefix, a netip.Addr) bool {
	bits := pfx.Bits()
	if pfx.Addr().Is4() {
		bits += 96
	}
	p16 := netip.PrefixFrom(netip.AddrFrom16(pfx.Addr().As16()), bits)
	return p16.Contains(netip.AddrFrom16(a.As16()))
}
