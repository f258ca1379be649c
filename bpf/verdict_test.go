package bpf_test

import (
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// delta is how one frame moved the program's counters.
type delta struct {
	selected, unselected, exempt, fragPass, fragDrop uint64
	malformed                                        [tiers.NumMalformed]uint64
	unclassified                                     [tiers.NumUnclassified]uint64
}

func diff(a, b bpf.Stats, wa, wb bpf.Window) delta {
	d := delta{
		selected:   b.SelectedPackets() - a.SelectedPackets(),
		unselected: b.Unselected.Packets - a.Unselected.Packets,
		exempt:     b.Exempt.Packets - a.Exempt.Packets,
		fragPass:   b.FragmentPass.Packets - a.FragmentPass.Packets,
		fragDrop:   b.FragmentDrop.Packets - a.FragmentDrop.Packets,
	}
	for i := range d.malformed {
		d.malformed[i] = b.Malformed[i].Packets - a.Malformed[i].Packets
	}
	for i := range d.unclassified {
		d.unclassified[i] = b.Unclassified[i].Packets - a.Unclassified[i].Packets
	}
	if wb.Count-wa.Count != d.selected && wb.Count != 1 {
		d.selected = ^uint64(0) // the window and the stats disagree
	}
	return d
}

var (
	selected   = delta{selected: 1}
	unselected = delta{unselected: 1}
	exempt     = delta{exempt: 1}
	fragPass   = delta{fragPass: 1}
	fragDrop   = delta{fragDrop: 1}
)

// malformedAs is the delta of one frame counted as malformed for reason m.
func malformedAs(m tiers.Malformed) delta {
	var d delta
	d.malformed[m] = 1
	return d
}

// selectedAs is the delta of one unclassified frame judged as selected
// (reason u).
func selectedAs(u tiers.Unclassified) delta {
	d := selected
	d.unclassified[u] = 1
	return d
}

// wantDelta is how the classification c of one frame moves the counters.
func wantDelta(c model.Classification) delta {
	switch c.Class {
	case model.ClassSelected:
		if c.Deep {
			return selectedAs(c.Unclassified)
		}
		return selected
	case model.ClassExempt:
		return exempt
	case model.ClassMalformed:
		return malformedAs(c.Malformed)
	case model.ClassFragment:
		return fragPass // when its first was not dropped
	}
	return unselected
}

// frag4 is an IPv4 fragment of datagram id: offset in 8-byte units.
func frag4(tb testing.TB, id uint16, offset uint16, more bool, payload ...gopacket.SerializableLayer) []byte {
	ip := IPv4(Src4, Dst4, layers.IPProtocolUDP)
	ip.Id, ip.FragOffset = id, offset
	if more {
		ip.Flags = layers.IPv4MoreFragments
	}
	return Serialize(tb, append([]gopacket.SerializableLayer{Eth(layers.EthernetTypeIPv4), ip}, payload...)...)
}

// frag6 is an IPv6 fragment of datagram id: offset in 8-byte units.
func frag6(tb testing.TB, id uint32, offset uint16, more bool, payload ...gopacket.SerializableLayer) []byte {
	fh := &IPv6Fragment{NextHeader: layers.IPProtocolUDP, FragmentOffset: offset, MoreFragments: more, Identification: id}
	return Serialize(tb, append([]gopacket.SerializableLayer{Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6Fragment), fh}, payload...)...)
}

func hopByHop(next layers.IPProtocol) *layers.IPv6HopByHop {
	h := &layers.IPv6HopByHop{}
	h.NextHeader = next
	h.Options = []*layers.IPv6HopByHopOption{{OptionType: 1, OptionLength: 4, OptionData: make([]byte, 4)}} // PadN
	return h
}

func destOpts(next layers.IPProtocol) *layers.IPv6Destination {
	d := &layers.IPv6Destination{}
	d.NextHeader = next
	d.Options = []*layers.IPv6DestinationOption{{OptionType: 1, OptionLength: 4, OptionData: make([]byte, 4)}}
	return d
}

// verdictCase is one row of the verdict table. The frame runs twice: with an
// empty window (tier 0) and with a saturated one (last tier, drop 100%).
type verdictCase struct {
	name  string
	frame []byte
	want  delta
	// wantClass is what the Go reference classifier must say.
	wantClass model.Class
}

func verdictCases(t testing.TB) []verdictCase {
	cases := append(parseVerdictCases(t), kernelCheckCases(t)...)
	cases = append(cases, selectVerdictCases(t)...)
	cases = append(cases, edgeCases(t)...)
	return append(cases, hostileCases(t)...)
}

// parseVerdictCases are the rows on the parser: IPv4 options, VLAN tags,
// IPv6 extension chains and fragments.
func parseVerdictCases(t testing.TB) []verdictCase {
	ip4 := func() *layers.IPv4 { return IPv4(Src4, Dst4, layers.IPProtocolUDP) }
	eth4 := func() *layers.Ethernet { return Eth(layers.EthernetTypeIPv4) }

	// IHL=6: options 01 01 02 02 (NOP, NOP, a 2-byte option) sit where a
	// fixed-offset parser would read the UDP destination port: 0x0202 = 514.
	opts := []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 2, OptionLength: 2}}
	ihl6 := func(dport uint16) []byte {
		ip := ip4()
		ip.Options = opts
		return Serialize(t, eth4(), ip, UDP(dport), Syslog())
	}
	if f := ihl6(53); f[14]&0x0f != 6 || f[36] != 2 || f[37] != 2 {
		t.Fatalf("IHL=6 frame is not built as intended: % x", f[14:42])
	}

	vlan := func(next layers.EthernetType) *layers.Dot1Q {
		return &layers.Dot1Q{VLANIdentifier: 42, Type: next}
	}
	qinq := Serialize(t, Eth(layers.EthernetTypeQinQ), vlan(layers.EthernetTypeDot1Q), vlan(layers.EthernetTypeIPv4), ip4(), UDP(514), Syslog())
	threeTags := Serialize(t, Eth(layers.EthernetTypeQinQ), vlan(layers.EthernetTypeDot1Q), vlan(layers.EthernetTypeDot1Q), vlan(layers.EthernetTypeIPv4), ip4(), UDP(514), Syslog())

	tooDeep := []gopacket.SerializableLayer{Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolIPv6Destination)}
	for range model.MaxIPv6ExtHeaders - 1 {
		tooDeep = append(tooDeep, destOpts(layers.IPProtocolIPv6Destination))
	}
	tooDeep = append(tooDeep, destOpts(layers.IPProtocolUDP), UDP(514), Syslog())
	// A first fragment that ends inside a destination-options header of
	// 24 bytes: the chain goes on in the next fragment.
	chainCut := Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6Fragment),
		&IPv6Fragment{NextHeader: layers.IPProtocolIPv6Destination, MoreFragments: true, Identification: 11},
		gopacket.Payload([]byte{17, 2, 1, 18, 0, 0, 0, 0}))
	deepest := []gopacket.SerializableLayer{Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolIPv6Destination)}
	for range model.MaxIPv6ExtHeaders - 2 {
		deepest = append(deepest, destOpts(layers.IPProtocolIPv6Destination))
	}
	deepest = append(deepest, destOpts(layers.IPProtocolUDP), UDP(514), Syslog())

	return []verdictCase{
		{"udp4/514", UDP4(t, 514), selected, model.ClassSelected},
		{"udp6/514", UDP6(t, 514), selected, model.ClassSelected},
		{"ipv4 IHL=6 udp/514", ihl6(514), selected, model.ClassSelected},
		{"ipv4 IHL=6 udp/53, options read as 514 at a fixed offset", ihl6(53), unselected, model.ClassUnselected},
		{"vlan udp/514", Serialize(t, Eth(layers.EthernetTypeDot1Q), vlan(layers.EthernetTypeIPv4), ip4(), UDP(514), Syslog()), selected, model.ClassSelected},
		{"qinq udp/514", qinq, selected, model.ClassSelected},
		{"three vlan tags: too deep, judged as selected", threeTags, selectedAs(tiers.UnclassifiedVLANDepth), model.ClassSelected},
		{"ipv6 hop-by-hop udp/514", Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolUDP), UDP(514), Syslog()), selected, model.ClassSelected},
		{"ipv6 dest-opts udp/514", Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6Destination), destOpts(layers.IPProtocolUDP), UDP(514), Syslog()), selected, model.ClassSelected},
		{"ipv6 hop-by-hop+dest-opts+fragment(atomic) udp/514", Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolIPv6Destination), destOpts(layers.IPProtocolIPv6Fragment), &IPv6Fragment{NextHeader: layers.IPProtocolUDP, Identification: 9}, UDP(514), Syslog()), selected, model.ClassSelected},
		{"ipv6 deepest walked chain udp/514", Serialize(t, deepest...), selected, model.ClassSelected},
		{"ipv6 chain one too deep, judged as selected", Serialize(t, tooDeep...), selectedAs(tiers.UnclassifiedIPv6Chain), model.ClassSelected},
		{"ipv6 chain one too deep to port 53, judged as selected", Serialize(t, append(tooDeep[:len(tooDeep)-2:len(tooDeep)-2], UDP(53), Syslog())...), selectedAs(tiers.UnclassifiedIPv6Chain), model.ClassSelected},
		{"ipv6 first fragment whose chain goes on in the next (RFC 7112)", chainCut, selectedAs(tiers.UnclassifiedFragmentChain), model.ClassSelected},
		{"ipv6 first fragment whose chain ends without room for udp", Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6Fragment), &IPv6Fragment{NextHeader: layers.IPProtocolIPv6Destination, MoreFragments: true, Identification: 12}, destOpts(layers.IPProtocolUDP)), malformedAs(tiers.MalformedTinyFragment), model.ClassMalformed},
	}
}

// kernelCheckCases are the rows on what the kernel itself discards or
// never delivers to a listener, and on fragments without their first.
func kernelCheckCases(t testing.TB) []verdictCase {
	eth4 := func() *layers.Ethernet { return Eth(layers.EthernetTypeIPv4) }
	badSum := UDP4(t, 514)
	badSum[24] ^= 0xff // the IPv4 header checksum
	synFlags := func(flags byte) []byte {
		f := TCP4(t, 601, true, false)
		f[14+20+13] = flags
		return f
	}
	return []verdictCase{
		{"ipv4 bad header checksum", badSum, malformedAs(tiers.MalformedIPv4Checksum), model.ClassMalformed},
		{"tcp/601 syn+rst: a listener discards it", synFlags(0x06), unselected, model.ClassUnselected},
		{"tcp/601 syn+fin: a listener discards it", synFlags(0x03), unselected, model.ClassUnselected},
		{"tcp/601 syn to the broadcast MAC: tcp discards it", func() []byte {
			f := TCP4(t, 601, true, false)
			copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			return f
		}(), unselected, model.ClassUnselected},
		{"udp/514 to the broadcast MAC", func() []byte {
			f := UDP4(t, 514)
			copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			return f
		}(), selected, model.ClassSelected},
		{"ipv4 non-first fragment before its first", frag4(t, 77, 185, false, gopacket.Payload(make([]byte, 64))), fragPass, model.ClassFragment},
		{"ipv6 non-first fragment before its first", frag6(t, 77, 185, false, gopacket.Payload(make([]byte, 64))), fragPass, model.ClassFragment},
		{"ipv4 non-first fragment of icmp", Serialize(t, eth4(), func() *layers.IPv4 {
			ip := IPv4(Src4, Dst4, layers.IPProtocolICMPv4)
			ip.FragOffset = 10
			return ip
		}(), gopacket.Payload(make([]byte, 32))), unselected, model.ClassUnselected},
	}
}

// selectVerdictCases are the rows on selection: control traffic, ports,
// TCP flags, exempt sources and destinations.
func selectVerdictCases(t testing.TB) []verdictCase {
	ip4 := func() *layers.IPv4 { return IPv4(Src4, Dst4, layers.IPProtocolUDP) }
	eth4 := func() *layers.Ethernet { return Eth(layers.EthernetTypeIPv4) }
	exemptIP := func() *layers.IPv4 { ip := ip4(); ip.SrcIP = net.IPv4(203, 0, 113, 7).To4(); return ip }
	otherDst := func() *layers.IPv4 { ip := ip4(); ip.DstIP = net.IPv4(203, 0, 113, 9).To4(); return ip }
	exempt6 := IPv6(net.ParseIP("2001:db8:ee::5"), Dst6, layers.IPProtocolUDP)

	arp := Serialize(t, Eth(layers.EthernetTypeARP), &layers.ARP{
		AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: layers.ARPRequest, SourceHwAddress: SrcMAC, SourceProtAddress: Src4,
		DstHwAddress: make([]byte, 6), DstProtAddress: Dst4,
	})
	ns := Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolICMPv6),
		&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0)},
		&layers.ICMPv6NeighborSolicitation{TargetAddress: Dst6})
	echo := Serialize(t, eth4(), IPv4(Src4, Dst4, layers.IPProtocolICMPv4),
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1})
	lldp := Serialize(t, &layers.Ethernet{SrcMAC: SrcMAC, DstMAC: []byte{0x01, 0x80, 0xc2, 0, 0, 0x0e}, EthernetType: layers.EthernetTypeLinkLayerDiscovery},
		&layers.LinkLayerDiscovery{
			ChassisID: layers.LLDPChassisID{Subtype: layers.LLDPChassisIDSubTypeMACAddr, ID: SrcMAC},
			PortID:    layers.LLDPPortID{Subtype: layers.LLDPPortIDSubtypeIfaceName, ID: []byte("eth0")},
			TTL:       120,
		})

	return []verdictCase{
		{"arp", arp, unselected, model.ClassUnselected},
		{"icmpv6 neighbour solicitation", ns, unselected, model.ClassUnselected},
		{"icmp echo", echo, unselected, model.ClassUnselected},
		{"tcp/22 syn", TCP4(t, 22, true, false), unselected, model.ClassUnselected},
		{"udp/53", UDP4(t, 53), unselected, model.ClassUnselected},
		{"lldp", lldp, unselected, model.ClassUnselected},
		{"tcp/601 syn", TCP4(t, 601, true, false), selected, model.ClassSelected},
		{"tcp/6514 syn", TCP4(t, 6514, true, false), selected, model.ClassSelected},
		{"tcp/601 syn-ack", TCP4(t, 601, true, true), unselected, model.ClassUnselected},
		{"tcp/601 ack", TCP4(t, 601, false, true), unselected, model.ClassUnselected},
		{"tcp/514 syn: udp rule only", TCP4(t, 514, true, false), unselected, model.ClassUnselected},
		{"udp/601: tcp rule only", UDP4(t, 601), unselected, model.ClassUnselected},
		{"exempt source ipv4", Serialize(t, eth4(), exemptIP(), UDP(514), Syslog()), exempt, model.ClassExempt},
		{"exempt source ipv6", Serialize(t, Eth(layers.EthernetTypeIPv6), exempt6, UDP(514), Syslog()), exempt, model.ClassExempt},
		{"exempt source, unselected port", Serialize(t, eth4(), exemptIP(), UDP(53), Syslog()), unselected, model.ClassUnselected},
		{"dests rule, matching ipv4 dest", UDP4(t, 5514), selected, model.ClassSelected},
		{"dests rule, matching ipv6 dest", UDP6(t, 5515), selected, model.ClassSelected},
		{"dests rule, other dest", Serialize(t, eth4(), otherDst(), UDP(5514), Syslog()), unselected, model.ClassUnselected},
		{"dests syn rule, syn", TCP4(t, 7000, true, false), selected, model.ClassSelected},
		{"dests syn rule, ack", TCP4(t, 7000, false, true), unselected, model.ClassUnselected},
	}
}

func TestVerdictTable(t *testing.T) {
	h := newHarness(t, testPolicy(t))
	for _, tc := range verdictCases(t) {
		c := model.Classify(h.p, tc.frame)
		if c.Class != tc.wantClass {
			t.Errorf("%s: reference classifier says %v, want %v", tc.name, c.Class, tc.wantClass)
		}
		if w := wantDelta(c); w != tc.want {
			t.Errorf("%s: reference classifier's counters %+v, want %+v", tc.name, w, tc.want)
		}
		for _, saturated := range []bool{false, true} {
			if saturated {
				h.preload(1_000_000_000) // the last tier: drop 100%
			} else {
				h.preload(0)
			}
			s0, w0 := h.stats(), h.window()
			ret := h.run(tc.frame)
			d := diff(s0, h.stats(), w0, h.window())
			if d != tc.want {
				t.Errorf("%s (saturated=%v): counters moved %+v, want %+v", tc.name, saturated, d, tc.want)
			}
			wantRet := uint32(xdpPass)
			if saturated && tc.want.selected == 1 || c.Drops(h.p) {
				wantRet = xdpDrop
			}
			if ret != wantRet {
				t.Errorf("%s (saturated=%v): action %d, want %d", tc.name, saturated, ret, wantRet)
			}
		}
	}
}

// TestFragmentsFollowFirst sends, per family, a non-first fragment before
// its first (it passes uncounted), then the first under a saturated window
// (dropped and remembered), then the non-first again (dropped, uncounted);
// and the same datagram with an empty window passes whole.
func TestFragmentsFollowFirst(t *testing.T) {
	h := newHarness(t, testPolicy(t))
	payload := gopacket.Payload(make([]byte, 64))
	for _, fam := range []struct {
		name        string
		first, next func(id int) []byte
	}{
		{"ipv4",
			func(id int) []byte { return frag4(t, uint16(id), 0, true, UDP(514), payload) },
			func(id int) []byte { return frag4(t, uint16(id), 10, false, payload) }},
		{"ipv6",
			func(id int) []byte { return frag6(t, uint32(id), 0, true, UDP(514), payload) },
			func(id int) []byte { return frag6(t, uint32(id), 10, false, payload) }},
		// A fragment header that names destination options or a
		// routing header before UDP (issue 33 item 4).
		{"ipv6 dest-opts",
			func(id int) []byte {
				return fragExt6(t, layers.IPProtocolIPv6Destination, uint32(id), 0, true, UDP(514), payload)
			},
			func(id int) []byte {
				return fragExt6(t, layers.IPProtocolIPv6Destination, uint32(id), 10, false, payload)
			}},
		{"ipv6 routing",
			func(id int) []byte {
				return fragExt6(t, layers.IPProtocolIPv6Routing, uint32(id), 0, true, UDP(514), payload)
			},
			func(id int) []byte { return fragExt6(t, layers.IPProtocolIPv6Routing, uint32(id), 10, false, payload) }},
	} {
		step := func(what string, frame []byte, wantRet uint32, want delta) {
			t.Helper()
			s0, w0 := h.stats(), h.window()
			ret := h.run(frame)
			if d := diff(s0, h.stats(), w0, h.window()); d != want || ret != wantRet {
				t.Errorf("%s %s: action %d counters %+v, want %d %+v", fam.name, what, ret, d, wantRet, want)
			}
		}
		if c := model.Classify(h.p, fam.first(1)); c.Class != model.ClassSelected || !c.FirstFragment {
			t.Errorf("%s: classifier says first fragment is %+v", fam.name, c)
		}
		h.preload(1_000_000_000)
		step("non-first before first", fam.next(1), xdpPass, fragPass)
		step("first, saturated", fam.first(1), xdpDrop, selected)
		step("non-first after dropped first", fam.next(1), xdpDrop, fragDrop)
		step("non-first of another datagram", fam.next(2), xdpPass, fragPass)
		h.preload(0)
		step("first, empty window", fam.first(3), xdpPass, selected)
		step("non-first after passed first", fam.next(3), xdpPass, fragPass)
	}
}

// TestTruncated cuts frames at every length inside their headers: each cut
// passes uncounted, as unselected (cut inside a fixed header) or malformed
// (the IP length runs past the cut), and the program agrees with the
// classifier at every length.
func TestTruncated(t *testing.T) {
	h := newHarness(t, testPolicy(t))
	h.preload(1_000_000_000)
	// Each frame with the length of its headers: Ethernet pads short frames
	// to 60 bytes, and a cut inside the padding is not a truncation.
	frames := map[string]struct {
		frame   []byte
		headers int
	}{
		"udp4":      {Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, Dst4, layers.IPProtocolUDP), UDP(514)), 14 + 20 + 8},
		"udp6":      {Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolUDP), UDP(514)), 14 + 40 + 8},
		"tcp4 syn":  {Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, Dst4, layers.IPProtocolTCP), &layers.TCP{SrcPort: 1, DstPort: 601, SYN: true, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{5, 0xb4}}}}), 14 + 20 + 24},
		"qinq udp4": {Serialize(t, Eth(layers.EthernetTypeQinQ), &layers.Dot1Q{Type: layers.EthernetTypeDot1Q}, &layers.Dot1Q{Type: layers.EthernetTypeIPv4}, IPv4(Src4, Dst4, layers.IPProtocolUDP), UDP(514)), 14 + 4 + 4 + 20 + 8},
		"ipv6 ext":  {Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolIPv6Fragment), &IPv6Fragment{NextHeader: layers.IPProtocolUDP, MoreFragments: true, Identification: 5}, UDP(514)), 14 + 40 + 8 + 8 + 8},
	}
	for name, f := range frames {
		full := f.frame
		for cut := 14; cut < f.headers; cut++ {
			frame := full[:cut]
			c := model.Classify(h.p, frame)
			if c.Class != model.ClassUnselected && c.Class != model.ClassMalformed {
				t.Errorf("%s cut at %d: classifier says %v, want unselected or malformed", name, cut, c.Class)
			}
			s0, w0 := h.stats(), h.window()
			ret := h.run(frame)
			if d := diff(s0, h.stats(), w0, h.window()); d != wantDelta(c) || ret != xdpPass {
				t.Errorf("%s cut at %d: action %d counters %+v, want pass, %+v", name, cut, ret, d, wantDelta(c))
			}
		}
		if ret := h.run(full[:f.headers]); ret != xdpDrop {
			t.Errorf("%s headers only: action %d, want drop", name, ret)
		}
		if c := model.Classify(h.p, full); c.Class != model.ClassSelected {
			t.Errorf("%s whole: classifier says %v", name, c.Class)
		}
		if ret := h.run(full); ret != xdpDrop {
			t.Errorf("%s whole: action %d, want drop", name, ret)
		}
	}
}
