package model

import (
	"encoding/binary"
	"net/netip"

	"github.com/tierlimit/tierlimit/tiers"
)

// The IPv6 layers of the reference classifier (classify.go): the fixed
// header, the extension headers the program walks and their options.

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
	pk.v6 = true
	pk.src = netip.AddrFrom16([16]byte(ip[8:24]))
	pk.dst = netip.AddrFrom16([16]byte(ip[24:40]))
	nh := int(ip[6])
	pk.off += 40
	pk.l4len = int(binary.BigEndian.Uint16(ip[4:]))
	// ip6_rcv_core's jumbogram path: a payload length of 0 with a
	// hop-by-hop header first is neither checked nor trimmed: the rest
	// of the frame, trailer included, is the payload.
	pk.jumbo = pk.l4len == 0 && nh == protoHopByHop
	if pk.jumbo {
		pk.l4len = len(pk.frame) - pk.off
	} else if !pk.has(pk.l4len) {
		return -1, malformed(tiers.MalformedIPv6Length)
	}
	for i := range MaxIPv6ExtHeaders {
		// Hop-by-hop options only right after the fixed header: Linux
		// discards them anywhere else (bpf/parse_ip.h parse_ipv6).
		if nh == protoHopByHop && i > 0 {
			return -1, &unselected
		}
		var stop *Classification
		switch nh {
		case protoFragment:
			if nh, stop = pk.fragment(); stop != nil || pk.next {
				return nh, stop
			}
		case protoAH:
			if nh, stop = pk.authHeader(tiers.MalformedIPv6Length); stop != nil {
				return -1, stop
			}
		case protoHopByHop, protoRouting, protoDestOpts:
			if nh, stop = pk.extHeader(nh); stop != nil {
				return -1, stop
			}
		default:
			return nh, nil
		}
	}
	if nh == protoHopByHop {
		return -1, &unselected
	}
	if isIPv6Ext(nh) {
		return -1, deep(tiers.UnclassifiedIPv6Chain)
	}
	return nh, nil
}

// fragment walks an IPv6 fragment header: 8 bytes within the payload
// (past it: pastPayload), after no other and not behind a payload length
// of 0, or unselected (ipv6_frag_rcv discards the packet: a payload
// length of 0 "inhibits frag. header", an atomic one too, and a second
// header meets the IP6SKB_FRAGMENTED the first set). Returns its next
// header; pk.next is set for a non-first fragment.
func (pk *packet) fragment() (int, *Classification) {
	if pk.l4len < 8 {
		return -1, pk.pastPayload(tiers.MalformedIPv6Length)
	}
	if pk.jumbo || pk.fragSeen {
		return -1, &unselected
	}
	pk.fragSeen = true
	fo := binary.BigEndian.Uint16(pk.frame[pk.off+2:])
	nh := int(pk.frame[pk.off])
	pk.fragProto = byte(nh)
	pk.fragOff = fo >> 3
	pk.off += 8
	pk.l4len -= 8
	if fo&0xfff8 != 0 {
		pk.next = true
		return nh, nil
	}
	pk.first = fo&1 != 0
	return nh, nil
}

// extHeader walks a hop-by-hop, routing or destination options header
// (next-header nh): its length within the payload (past it:
// pastPayload), and, but in a routing header, its options (options):
// unselected when Linux discards the packet for them. Returns its next
// header.
func (pk *packet) extHeader(nh int) (int, *Classification) {
	if pk.l4len < 2 {
		return -1, pk.pastPayload(tiers.MalformedIPv6Length)
	}
	size := (int(pk.frame[pk.off+1]) + 1) * 8
	if size > pk.l4len {
		return -1, pk.pastPayload(tiers.MalformedIPv6Length)
	}
	if nh != protoRouting {
		jumbo, discard := pk.options(size, nh == protoDestOpts)
		if discard {
			return -1, &unselected
		}
		if jumbo > 0 {
			pk.l4len = jumbo
		}
	}
	next := int(pk.frame[pk.off])
	pk.off += size
	pk.l4len -= size
	return next, nil
}

// MaxOptions is the most options of a hop-by-hop or destination options
// header the program reads.
const MaxOptions = 8

// options reads the options of the hop-by-hop (dst false) or destination
// options header of size bytes at the cursor as the program does
// (bpf/parse_ip.h tl_ipv6_options, after Linux's ip6_parse_tlv): discard
// when an option runs past the header, a hop-by-hop Jumbo Payload option
// is one ipv6_hop_jumbo refuses, or an option Linux does not know has
// action bits that say discard (a Home Address option stays counted); at
// most MaxOptions options. Returns a Jumbo Payload option's value when
// the kernel takes it.
func (pk *packet) options(size int, dst bool) (jumbo int, discard bool) {
	h := pk.frame[pk.off : pk.off+size]
	rest := 0 // the frame after the IPv6 header, on the jumbogram path
	if pk.jumbo {
		rest = pk.l4len
	}
	off := 2
	for range MaxOptions {
		if off >= size {
			break
		}
		typ := h[off]
		if typ == 0 { // Pad1
			off++
			continue
		}
		if size-off < 2 {
			return 0, true
		}
		olen := int(h[off+1]) + 2
		if olen > size-off {
			return 0, true
		}
		switch {
		case typ == 0xc2 && !dst: // Jumbo Payload, ipv6_hop_jumbo
			if h[off+1] != 4 || off&3 != 2 {
				return 0, true
			}
			v := int(binary.BigEndian.Uint32(h[off+2:]))
			if v <= 0xffff || v > rest {
				return 0, true
			}
			jumbo = v
		case typ&0xc0 != 0 && !(dst && typ == 0xc9): // not a Home Address
			return 0, true
		}
		off += olen
	}
	return jumbo, false
}

// pastPayload is an extension header that does not fit in the IP payload:
// in an IPv6 first fragment the chain goes on in a later one (deep),
// anywhere else it is malformed for reason.
func (pk *packet) pastPayload(reason tiers.Malformed) *Classification {
	if pk.first && pk.v6 {
		return deep(tiers.UnclassifiedFragmentChain)
	}
	return malformed(reason)
}

// authHeader walks an Authentication Header (RFC 4302): 12 bytes in the
// frame, its length ((len + 2) × 4) within the IP payload or malformed for
// reason. Returns its next header.
func (pk *packet) authHeader(reason tiers.Malformed) (int, *Classification) {
	if pk.l4len < 12 {
		return -1, pk.pastPayload(reason)
	}
	size := (int(pk.frame[pk.off+1]) + 2) * 4
	if size > pk.l4len {
		return -1, pk.pastPayload(reason)
	}
	nh := int(pk.frame[pk.off])
	pk.off += size
	pk.l4len -= size
	return nh, nil
}
