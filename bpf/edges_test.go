package bpf_test

import (
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// hopByHopOpt is a hop-by-hop header holding one option of type typ with
// data, padded to 8 bytes.
func hopByHopOpt(next layers.IPProtocol, typ byte, data []byte) *layers.IPv6HopByHop {
	h := &layers.IPv6HopByHop{}
	h.NextHeader = next
	h.Options = []*layers.IPv6HopByHopOption{{OptionType: typ, OptionLength: uint8(len(data)), OptionData: data}}
	return h
}

// edgeCases are the verdict-table rows of issue 33: length fields at the
// values where Linux reads them as something other than a length
// (docs/design.md §2). An IPv6 UDP length of 0 is the rest of the payload
// (__udp6_lib_rcv); an IPv6 payload length of 0 with a hop-by-hop header
// first is the rest of the frame, trailer included (ip6_rcv_core's
// jumbogram path), unless a Jumbo Payload option, which ipv6_hop_jumbo
// refuses below 64 KiB, or a fragment header (ipv6_frag_rcv) makes the
// kernel discard it.
func edgeCases(t testing.TB) []verdictCase {
	eth6 := func() *layers.Ethernet { return Eth(layers.EthernetTypeIPv6) }
	ip6 := func(next layers.IPProtocol) *layers.IPv6 { return IPv6(Src6, Dst6, next) }
	udp4, udp6 := UDP4(t, 514), UDP6(t, 514)
	hbhUDP := Serialize(t, eth6(), ip6(layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolUDP), UDP(514), Syslog())
	hbhSYN := Serialize(t, eth6(), ip6(layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolTCP), TCP(601, true, false))
	hbhOpt := func(typ byte, data []byte) []byte {
		return Serialize(t, eth6(), ip6(layers.IPProtocolIPv6HopByHop), hopByHopOpt(layers.IPProtocolUDP, typ, data), UDP(514), Syslog())
	}
	jumbo := hbhOpt(0xc2, []byte{0, 1, 0x11, 0x70}) // 70000
	dstOpt := func(typ byte, data []byte) []byte {
		d := &layers.IPv6Destination{}
		d.NextHeader = layers.IPProtocolUDP
		d.Options = []*layers.IPv6DestinationOption{{OptionType: typ, OptionLength: uint8(len(data)), OptionData: data}}
		return Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Destination), d, UDP(514), Syslog())
	}
	hbhFrag := Serialize(t, eth6(), ip6(layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolIPv6Fragment),
		&IPv6Fragment{NextHeader: layers.IPProtocolUDP, Identification: 33}, UDP(514), Syslog())
	dstUDP := Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Destination), destOpts(layers.IPProtocolUDP), UDP(514), Syslog())
	trailer := func(f []byte, n int) []byte { return append(append([]byte(nil), f...), make([]byte, n)...) }
	udpMal := malformedAs(tiers.MalformedUDPLength)
	return []verdictCase{
		{"udp6/514 UDP length 0: the rest of the payload", with16(udp6, l4Off6+udpLen, 0), selected, model.ClassSelected},
		{"udp6/514 UDP length 0 with a trailer past the payload length", trailer(with16(udp6, l4Off6+udpLen, 0), 20), selected, model.ClassSelected},
		{"udp6/514 UDP length 7", with16(udp6, l4Off6+udpLen, 7), udpMal, model.ClassMalformed},
		{"udp6/514 UDP length 1", with16(udp6, l4Off6+udpLen, 1), udpMal, model.ClassMalformed},
		{"udp4/514 UDP length 0: IPv4 discards it", with16(udp4, l4Off4+udpLen, 0), udpMal, model.ClassMalformed},
		{"ipv6 payload length 0, hop-by-hop (PadN) first, udp/514", with16(hbhUDP, ipv6Pay, 0), selected, model.ClassSelected},
		{"ipv6 payload length 0, hop-by-hop first, udp/514, trailer", trailer(with16(hbhUDP, ipv6Pay, 0), 30), selected, model.ClassSelected},
		{"ipv6 payload length 0, hop-by-hop first, UDP length 0", with16(with16(hbhUDP, ipv6Pay, 0), l4Off6+8+udpLen, 0), selected, model.ClassSelected},
		{"ipv6 payload length 0, hop-by-hop (PadN) first, tcp/601 syn", with16(hbhSYN, ipv6Pay, 0), selected, model.ClassSelected},
		{"ipv6 payload length 0, hop-by-hop with a Jumbo Payload of 70000", with16(jumbo, ipv6Pay, 0), unselected, model.ClassUnselected},
		{"ipv6 hop-by-hop with a Jumbo Payload and a payload length", jumbo, unselected, model.ClassUnselected},
		{"ipv6 payload length 0, hop-by-hop then an atomic fragment", with16(hbhFrag, ipv6Pay, 0), unselected, model.ClassUnselected},
		{"ipv6 payload length 0, dest-opts first: no jumbogram path", with16(dstUDP, ipv6Pay, 0), malformedAs(tiers.MalformedIPv6Length), model.ClassMalformed},
		{"ipv6 hop-by-hop option 0x1e (skip)", hbhOpt(0x1e, []byte{0, 0, 0, 0}), selected, model.ClassSelected},
		{"ipv6 hop-by-hop option 0x5e (discard)", hbhOpt(0x5e, []byte{0, 0, 0, 0}), unselected, model.ClassUnselected},
		{"ipv6 hop-by-hop option 0x9e (discard, icmp)", hbhOpt(0x9e, []byte{0, 0, 0, 0}), unselected, model.ClassUnselected},
		{"ipv6 hop-by-hop option 0xde (discard, icmp unless multicast)", hbhOpt(0xde, []byte{0, 0, 0, 0}), unselected, model.ClassUnselected},
		{"ipv6 non-first fragment naming dest-opts follows its first", fragExt6(t, layers.IPProtocolIPv6Destination, 0x3301, 20, false, gopacket.Payload(make([]byte, 32))), fragPass, model.ClassFragment},
		{"ipv6 non-first fragment naming routing follows its first", fragExt6(t, layers.IPProtocolIPv6Routing, 0x3302, 20, false, gopacket.Payload(make([]byte, 32))), fragPass, model.ClassFragment},
		{"ipv6 dest-opts option 0x5e (discard)", dstOpt(0x5e, []byte{0, 0, 0, 0}), unselected, model.ClassUnselected},
		{"ipv6 dest-opts Jumbo Payload: unknown there, discard", dstOpt(0xc2, []byte{0, 1, 0x11, 0x70}), unselected, model.ClassUnselected},
		{"ipv6 dest-opts option 0x1e (skip)", dstOpt(0x1e, []byte{0, 0, 0, 0}), selected, model.ClassSelected},
		{"ipv6 dest-opts Home Address (0xc9): counted, not certain", dstOpt(0xc9, make([]byte, 16)), selected, model.ClassSelected},
		{"ipv6 routing then dest-opts option 0x9e (discard)", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Routing), &ExtHeader{NextHeader: layers.IPProtocolIPv6Destination},
			func() *layers.IPv6Destination {
				d := &layers.IPv6Destination{}
				d.NextHeader = layers.IPProtocolUDP
				d.Options = []*layers.IPv6DestinationOption{{OptionType: 0x9e, OptionLength: 4, OptionData: make([]byte, 4)}}
				return d
			}(), UDP(514), Syslog()), unselected, model.ClassUnselected},
		{"ipv6 two atomic fragment headers", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Fragment),
			&IPv6Fragment{NextHeader: layers.IPProtocolIPv6Fragment, Identification: 34},
			&IPv6Fragment{NextHeader: layers.IPProtocolUDP, Identification: 35}, UDP(514), Syslog()), unselected, model.ClassUnselected},
		{"ipv6 first fragment, then an atomic fragment header", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Fragment),
			&IPv6Fragment{NextHeader: layers.IPProtocolIPv6Destination, MoreFragments: true, Identification: 36}, destOpts(layers.IPProtocolIPv6Fragment),
			&IPv6Fragment{NextHeader: layers.IPProtocolUDP, Identification: 37}, UDP(514), Syslog()), unselected, model.ClassUnselected},
		{"ipv6 hop-by-hop option past the header", func() []byte {
			f := hbhOpt(0x1e, []byte{0, 0, 0, 0})
			f[l4Off6+3] = 5 // 7 bytes where 6 are left
			return f
		}(), unselected, model.ClassUnselected},
	}
}

// fragExt6 is an IPv6 fragment of datagram id whose fragment header names
// ext (destination options or routing): the first (offset 0) carries that
// header, naming UDP, before the payload; offset in 8-byte units.
func fragExt6(tb testing.TB, ext layers.IPProtocol, id uint32, offset uint16, more bool, payload ...gopacket.SerializableLayer) []byte {
	fh := &IPv6Fragment{NextHeader: ext, FragmentOffset: offset, MoreFragments: more, Identification: id}
	ls := []gopacket.SerializableLayer{Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6Fragment), fh}
	if offset == 0 {
		if ext == layers.IPProtocolIPv6Destination {
			ls = append(ls, destOpts(layers.IPProtocolUDP))
		} else {
			ls = append(ls, &ExtHeader{NextHeader: layers.IPProtocolUDP})
		}
	}
	return Serialize(tb, append(ls, payload...)...)
}

// withTags returns frame with VLAN tags of TPID tpid and the given VIDs,
// outermost first, inserted after its MAC addresses.
func withTags(frame []byte, tpid uint16, vids ...uint16) []byte {
	f := append([]byte(nil), frame[:12]...)
	for _, v := range vids {
		f = append(f, byte(tpid>>8), byte(tpid), byte(v>>8), byte(v))
	}
	return append(f, frame[12:]...)
}
