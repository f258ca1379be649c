package tiers

// Malformed is why a frame is malformed (model.ClassMalformed). The values
// mirror bpf/types.h enum tl_malformed (bpf's TestContract checks them) and
// index the program's malformed_stats map.
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
	// MalformedIPv4Checksum: the IPv4 header checksum fails (Linux's
	// ip_rcv_core discards it before it reads the total length).
	MalformedIPv4Checksum
	// NumMalformed is the number of reasons.
	NumMalformed
)

// MalformedReasons lists every reason, in order.
var MalformedReasons = []Malformed{MalformedIPv4Length, MalformedIPv6Length, MalformedUDPLength, MalformedTCPLength, MalformedTinyFragment, MalformedIPv4Checksum}

// String is the reason's metric label: ipv4_length, ipv6_length,
// udp_length, tcp_length, tiny_fragment or ipv4_checksum.
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
	case MalformedIPv4Checksum:
		return "ipv4_checksum"
	}
	return "unknown"
}

// Unclassified is why the program cannot tell the destination port of a
// frame that Linux may deliver (docs/design.md §2, "The kernel is the oracle"):
// such a frame is judged as selected, and counted under its reason as
// well. The values mirror bpf/types.h enum tl_unclassified (bpf's
// TestContract checks them) and index the program's unclassified_stats.
type Unclassified uint8

const (
	// UnclassifiedVLANDepth: more VLAN tags than the program parses
	// (model.MaxVLANTags). Linux strips priority tags (VLAN 0) however many
	// there are.
	UnclassifiedVLANDepth Unclassified = iota
	// UnclassifiedIPv6Chain: more IPv6 extension headers than
	// model.MaxIPv6ExtHeaders; Linux walks any number.
	UnclassifiedIPv6Chain
	// UnclassifiedFragmentChain: an IPv6 first fragment whose header chain
	// goes on in a later fragment. Linux discards a first fragment whose
	// chain ends in it without room for the L4 header (RFC 7112), but
	// reassembles and delivers one whose chain it cannot follow to its
	// end.
	UnclassifiedFragmentChain
	// NumUnclassified is the number of reasons.
	NumUnclassified
)

// UnclassifiedReasons lists every reason, in order.
var UnclassifiedReasons = []Unclassified{UnclassifiedVLANDepth, UnclassifiedIPv6Chain, UnclassifiedFragmentChain}

// String is the reason's metric label: vlan_depth, ipv6_chain or
// fragment_chain.
func (u Unclassified) String() string {
	switch u {
	case UnclassifiedVLANDepth:
		return "vlan_depth"
	case UnclassifiedIPv6Chain:
		return "ipv6_chain"
	case UnclassifiedFragmentChain:
		return "fragment_chain"
	}
	return "unknown"
}
