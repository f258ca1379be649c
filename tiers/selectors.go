package tiers

import (
	"net/netip"
	"slices"
)

// Key encodings of the XDP program's selector maps. They mirror bpf/types.h
// (enum tl_const, enum tl_port_flag); bpf's TestContract fails when the two
// disagree. Keys here are slot-relative: package bpf adds the slot.
const (
	// PortKeys is the number of destination-port keys per protocol: a
	// PortSelector's Key is PortKeys × isTCP + port.
	PortKeys = 65536
	// PortFlagPackets marks a port that a rule without dests selects for
	// every packet.
	PortFlagPackets = 1
	// PortFlagSYN marks a port that a tcp rule without dests selects for
	// connection attempts (SYN without ACK) only.
	PortFlagSYN = 2
	// LPMTagBits is how many bits of a PrefixKey's Prefixlen cover its Tag,
	// which comes before the address.
	LPMTagBits = 32
	// LPMAddrBits is how many bits of a PrefixKey's Prefixlen can cover its
	// address: IPv6, or IPv4 as IPv4-mapped IPv6 (RFC 4291 §2.5.5.2).
	LPMAddrBits = 128
	// DestRuleBits is where the program puts the slot in a dests Tag:
	// family | slot << DestRuleBits. The bits below it were the rule's
	// number up to layout 1, and are 0: one entry per destination holds
	// its rules (DestKey).
	DestRuleBits = 8
	// LPMTagIPv6 is the Tag bit of an IPv6 prefix. IPv4 prefixes leave it
	// clear, and the program sets it for IPv6 packets only, so a prefix
	// matches packets of its own family and no other: ::/0 no IPv4 packet,
	// 10.0.0.0/8 no IPv6 packet from ::ffff:10.0.0.1.
	LPMTagIPv6 = 1 << 30
)

// PortSelector is what the select rules say about one destination port of
// one protocol: an entry of the program's ports map.
type PortSelector struct {
	// Key is PortKeys × isTCP + port.
	Key uint32
	// Flags holds PortFlagPackets and PortFlagSYN, for rules without dests.
	Flags uint32
	// CidrRules has bit i set when rule i, which has dests, selects the port.
	CidrRules uint32
}

// PrefixKey is a prefix as the program's LPM tries hold it.
type PrefixKey struct {
	// Prefixlen is LPMTagBits plus the prefix length in Addr's 128 bits.
	Prefixlen uint32
	// Tag is LPMTagIPv6 for an IPv6 prefix, 0 for IPv4; the program adds
	// the slot (above DestRuleBits for dests).
	Tag uint32
	// Addr is the masked address, IPv4 as IPv4-mapped IPv6.
	Addr [16]byte
}

// Prefix returns the prefix that k encodes, as written in the config.
func (k PrefixKey) Prefix() netip.Prefix {
	a := netip.AddrFrom16(k.Addr)
	bits := int(k.Prefixlen - LPMTagBits)
	if k.Tag&LPMTagIPv6 == 0 {
		return netip.PrefixFrom(a.Unmap(), bits-96)
	}
	return netip.PrefixFrom(a, bits)
}

// Selectors are a policy's select rules and exempt sources in the key
// encoding of the program's maps.
type Selectors struct {
	// Ports lists the ports that some rule selects, by increasing Key.
	Ports []PortSelector
	// SynRules has bit i set when rule i has dests and counts SYN only.
	SynRules uint32
	// DestRules has bit i set when rule i has dests; AnyDest is set when
	// some rule has none. They decide which unclassified frames, whose
	// port is unknown, are counted (model.Classification.Deep).
	DestRules uint32
	AnyDest   bool
	// Dests holds the destination prefixes of the rules that have dests,
	// each once however many rules name it (DestKey).
	Dests []DestKey
	// Exempt holds the exempt source prefixes.
	Exempt []PrefixKey
}

// DestKey is one destination prefix of the select rules and its value in
// the program's destination trie: the rules whose dests hold every
// address of the prefix, bit i for rule i. Those are the rules that name
// the prefix, and the rules that name a shorter prefix containing it: a
// trie answers with the longest prefix that matches alone, which then
// answers for every rule.
type DestKey struct {
	PrefixKey
	Rules uint32
}

// prefixKey encodes pfx with tag and pfx's family.
func prefixKey(tag uint32, pfx netip.Prefix) PrefixKey {
	pfx = pfx.Masked()
	bits := pfx.Bits()
	if pfx.Addr().Is4() {
		bits += 96
	} else {
		tag |= LPMTagIPv6
	}
	return PrefixKey{Prefixlen: LPMTagBits + uint32(bits), Tag: tag, Addr: pfx.Addr().As16()}
}

// compileSelectors encodes the select rules and exempt sources of a valid
// policy. Its cost is bounded by the port space (2 × PortKeys entries)
// whatever the number of ranges: each rule's ranges are merged first.
func compileSelectors(p Policy) Selectors {
	var s Selectors
	dense := make([]PortSelector, 2*PortKeys)
	for i, r := range p.Select {
		base := uint32(0)
		if r.Proto == ProtoTCP {
			base = PortKeys
		}
		for _, pr := range MergeRanges(r.Ports) {
			for port := uint32(pr.First); port <= uint32(pr.Last); port++ {
				ps := &dense[base+port]
				switch {
				case r.hasDests():
					ps.CidrRules |= 1 << i
				case r.Count == CountSYN:
					ps.Flags |= PortFlagSYN
				default:
					ps.Flags |= PortFlagPackets
				}
			}
		}
		if r.hasDests() && r.Count == CountSYN {
			s.SynRules |= 1 << i
		}
		if r.hasDests() {
			s.DestRules |= 1 << i
		} else {
			s.AnyDest = true
		}
	}
	s.Dests = compileDests(p)
	for key, ps := range dense {
		if ps.Flags != 0 || ps.CidrRules != 0 {
			ps.Key = uint32(key)
			s.Ports = append(s.Ports, ps)
		}
	}
	for _, e := range p.Exempt {
		s.Exempt = append(s.Exempt, prefixKey(0, e))
	}
	return s
}

// destRules returns the distinct destination prefixes (masked) of p's
// select rules, Dests and LocalDests, in the order they first appear, and
// the rules that name each.
func destRules(p Policy) ([]netip.Prefix, map[netip.Prefix]uint32) {
	var order []netip.Prefix
	rules := make(map[netip.Prefix]uint32)
	for i, r := range p.Select {
		for _, ds := range [][]netip.Prefix{r.Dests, r.LocalDests} {
			for _, d := range ds {
				d = d.Masked()
				if _, ok := rules[d]; !ok {
					order = append(order, d)
				}
				rules[d] |= 1 << i
			}
		}
	}
	return order, rules
}

// compileDests returns the destination trie's entries of p: one per
// distinct prefix, holding the rules of the prefix and of every shorter
// one that contains it (DestKey). Prefixes nest or are disjoint, so, sorted
// by address and then length, each one's containing prefixes are the
// stack of those before it that contain it: O(n log n).
func compileDests(p Policy) []DestKey {
	order, rules := destRules(p)
	sorted := slices.Clone(order)
	slices.SortFunc(sorted, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	held := make(map[netip.Prefix]uint32, len(sorted))
	var stack []netip.Prefix
	for _, d := range sorted {
		for len(stack) > 0 && !stack[len(stack)-1].Contains(d.Addr()) {
			stack = stack[:len(stack)-1]
		}
		held[d] = rules[d]
		if len(stack) > 0 {
			held[d] |= held[stack[len(stack)-1]]
		}
		stack = append(stack, d)
	}
	out := make([]DestKey, len(order))
	for i, d := range order {
		out[i] = DestKey{PrefixKey: prefixKey(0, d), Rules: held[d]}
	}
	return out
}

// DestEntries is how many entries p's select rules take in the program's
// destination trie per policy slot: one per distinct prefix of their
// dests and resolved local destinations together, however many rules
// name it. Validate returns ErrTooMany beyond MaxPrefixes +
// MaxLocalPrefixes.
func DestEntries(p Policy) int {
	order, _ := destRules(p)
	return len(order)
}

// hasDests reports whether the rule matches some destinations only: it
// has dests, or resolved local ones.
func (r Rule) hasDests() bool { return len(r.Dests) > 0 || len(r.LocalDests) > 0 }

// MergeRanges returns rs sorted by First with overlapping and adjacent
// ranges joined; rs is not changed.
func MergeRanges(rs []PortRange) []PortRange {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b PortRange) int { return int(a.First) - int(b.First) })
	out := s[:0]
	for _, r := range s {
		if n := len(out); n > 0 && int(r.First) <= int(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}
