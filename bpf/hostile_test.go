package bpf_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// Header offsets in an untagged Ethernet frame.
const (
	l3Off   = 14         // the IP header
	l4Off4  = l3Off + 20 // the L4 header after an IPv4 header without options
	l4Off6  = l3Off + 40 // the L4 header after a bare IPv6 header
	ipv4Tot = l3Off + 2  // IPv4 total length
	ipv6Pay = l3Off + 4  // IPv6 payload length
	udpLen  = 4          // UDP length, from the UDP header
	tcpDoff = 12         // TCP data offset (high nibble), from the TCP header
)

// with16 returns a copy of frame with the big-endian 16-bit field at off
// set to v: a length field that disagrees with the frame gopacket built.
// An IPv4 header it changes gets its checksum fixed, so that the frame is
// judged on the field, not on the checksum the kernel would discard it for.
func with16(frame []byte, off int, v uint16) []byte {
	f := append([]byte(nil), frame...)
	binary.BigEndian.PutUint16(f[off:], v)
	if binary.BigEndian.Uint16(f[12:]) == 0x0800 && off < l3Off+int(f[l3Off]&0xf)*4 {
		setIPv4Sum(f)
	}
	return f
}

// setIPv4Sum writes the header checksum of the untagged IPv4 frame f.
func setIPv4Sum(f []byte) {
	h := f[l3Off : l3Off+int(f[l3Off]&0xf)*4]
	binary.BigEndian.PutUint16(h[10:], 0)
	binary.BigEndian.PutUint16(h[10:], csum16(0, h))
}

// fragIPv4 is an IPv4 header of a fragment of datagram id carrying proto,
// at offset (8-byte units).
func fragIPv4(proto layers.IPProtocol, id, offset uint16, more bool) *layers.IPv4 {
	ip := IPv4(Src4, Dst4, proto)
	ip.Id, ip.FragOffset = id, offset
	if more {
		ip.Flags = layers.IPv4MoreFragments
	}
	return ip
}

// synHeader is the 20-byte TCP header of a SYN to dport, as a sender would
// split it across fragments.
func synHeader(tb testing.TB, dport uint16) []byte {
	f := TCP4(tb, dport, true, false)
	return f[l4Off4 : l4Off4+20]
}

// hostileCases are the verdict-table rows of issue 10: tiny fragments
// (RFC 1858), every IPv6 next-header value (RFC 8200 §4, IANA), address
// families and malformed length fields.
func hostileCases(t testing.TB) []verdictCase {
	eth4 := func() *layers.Ethernet { return Eth(layers.EthernetTypeIPv4) }
	eth6 := func() *layers.Ethernet { return Eth(layers.EthernetTypeIPv6) }
	ip6 := func(next layers.IPProtocol) *layers.IPv6 { return IPv6(Src6, Dst6, next) }
	syn := synHeader(t, 6514)
	udpHdr := Serialize(t, eth4(), IPv4(Src4, Dst4, layers.IPProtocolUDP), UDP(514), Syslog())[l4Off4 : l4Off4+8]
	tiny := malformedAs(tiers.MalformedTinyFragment)

	cases := []verdictCase{
		// 2. The L4 header split across fragments (RFC 1858).
		{"tcp4/6514 syn: first fragment with 8 bytes of TCP header", Serialize(t, eth4(), fragIPv4(layers.IPProtocolTCP, 0x7001, 0, true), gopacket.Payload(syn[:8])), tiny, model.ClassMalformed},
		{"tcp4: fragment at offset 8 bytes (rewrites the flags)", Serialize(t, eth4(), fragIPv4(layers.IPProtocolTCP, 0x7001, 1, false), gopacket.Payload(syn[8:])), tiny, model.ClassMalformed},
		{"tcp4/6514 syn: first fragment with the whole TCP header", Serialize(t, eth4(), fragIPv4(layers.IPProtocolTCP, 0x7002, 0, true), gopacket.Payload(syn), gopacket.Payload(make([]byte, 16))), selected, model.ClassSelected},
		{"tcp4/22 syn: tiny first fragment, unselected port", Serialize(t, eth4(), fragIPv4(layers.IPProtocolTCP, 0x7003, 0, true), gopacket.Payload(synHeader(t, 22)[:8])), tiny, model.ClassMalformed},
		{"udp4/514: first fragment with 4 bytes of UDP header", Serialize(t, eth4(), fragIPv4(layers.IPProtocolUDP, 0x7004, 0, true), gopacket.Payload(udpHdr[:4])), tiny, model.ClassMalformed},
		{"udp6/514: first fragment with 4 bytes of UDP header", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Fragment), &IPv6Fragment{NextHeader: layers.IPProtocolUDP, MoreFragments: true, Identification: 0x7005}, gopacket.Payload(udpHdr[:4])), tiny, model.ClassMalformed},
		{"tcp6: fragment at offset 8 bytes", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Fragment), &IPv6Fragment{NextHeader: layers.IPProtocolTCP, FragmentOffset: 1, Identification: 0x7006}, gopacket.Payload(syn[8:])), tiny, model.ClassMalformed},
		{"udp4: fragment at offset 8 bytes follows its first", Serialize(t, eth4(), fragIPv4(layers.IPProtocolUDP, 0x7007, 1, false), gopacket.Payload(make([]byte, 32))), fragPass, model.ClassFragment},

		// 3. Every IPv6 next-header value before L4: walked or passed uncounted.
		{"ipv6 AH (24 bytes) udp/514", Serialize(t, eth6(), ip6(layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolUDP, ICVLen: 12}, UDP(514), Syslog()), selected, model.ClassSelected},
		{"ipv6 AH tcp/6514 syn", Serialize(t, eth6(), ip6(layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolTCP, ICVLen: 12}, TCP(6514, true, false)), selected, model.ClassSelected},
		{"ipv6 hop-by-hop+AH+dest-opts udp/514", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolIPv6Destination, ICVLen: 12}, destOpts(layers.IPProtocolUDP), UDP(514), Syslog()), selected, model.ClassSelected},
		{"ipv6 fragment(first)+AH udp/514", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Fragment), &IPv6Fragment{NextHeader: layers.IPProtocolAH, MoreFragments: true, Identification: 0x7010}, &AH{NextHeader: layers.IPProtocolUDP, ICVLen: 12}, UDP(514), Syslog()), selected, model.ClassSelected},
		{"ipv6 non-first fragment of AH", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Fragment), &IPv6Fragment{NextHeader: layers.IPProtocolAH, FragmentOffset: 20, Identification: 0x7011}, gopacket.Payload(make([]byte, 32))), fragPass, model.ClassFragment},
		{"ipv6 routing (43) udp/514", Serialize(t, eth6(), ip6(layers.IPProtocolIPv6Routing), &ExtHeader{NextHeader: layers.IPProtocolUDP}, UDP(514), Syslog()), selected, model.ClassSelected},
		{"ipv6 AH udp/53", Serialize(t, eth6(), ip6(layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolUDP, ICVLen: 12}, UDP(53), Syslog()), unselected, model.ClassUnselected},
		{"ipv6 AH past the payload length", with16(Serialize(t, eth6(), ip6(layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolUDP, ICVLen: 12}, UDP(514), Syslog()), ipv6Pay, 16), malformedAs(tiers.MalformedIPv6Length), model.ClassMalformed},
		{"ipv4 AH udp/514", Serialize(t, eth4(), IPv4(Src4, Dst4, layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolUDP, ICVLen: 12}, UDP(514), Syslog()), selected, model.ClassSelected},
		{"ipv4 AH past the total length", with16(Serialize(t, eth4(), IPv4(Src4, Dst4, layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolUDP, ICVLen: 12}, UDP(514), Syslog()), ipv4Tot, 20+16), malformedAs(tiers.MalformedIPv4Length), model.ClassMalformed},
		// An AH whose length field says 8 bytes and whose IP length ends
		// there, with the frame going on: the fixed 12 bytes are past the
		// payload (ah6_input and ah_input pull them from the trimmed skb).
		{"ipv6 AH fixed part past the payload length, frame longer", with16(with16(Serialize(t, eth6(), ip6(layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolUDP, ICVLen: 12}, UDP(514), Syslog()), l4Off6, uint16(layers.IPProtocolUDP)<<8), ipv6Pay, 8), malformedAs(tiers.MalformedIPv6Length), model.ClassMalformed},
		{"ipv4 AH fixed part past the total length, frame longer", with16(with16(Serialize(t, eth4(), IPv4(Src4, Dst4, layers.IPProtocolAH), &AH{NextHeader: layers.IPProtocolUDP, ICVLen: 12}, UDP(514), Syslog()), l4Off4, uint16(layers.IPProtocolUDP)<<8), ipv4Tot, 20+8), malformedAs(tiers.MalformedIPv4Length), model.ClassMalformed},
		{"ipv6 ESP (50): encrypted", Serialize(t, eth6(), ip6(layers.IPProtocolESP), gopacket.Payload(make([]byte, 64))), unselected, model.ClassUnselected},
	}
	// Not walked: the kernel delivers no UDP behind them (parse.h
	// ipv6_is_ext). Each is followed by what would be a UDP/514 header.
	for _, nh := range []layers.IPProtocol{135, 139, 140, 253, 254, layers.IPProtocolNoNextHeader} {
		cases = append(cases, verdictCase{
			"ipv6 next header " + nh.String() + " then udp/514: passed uncounted",
			Serialize(t, eth6(), ip6(nh), &ExtHeader{NextHeader: layers.IPProtocolUDP}, UDP(514), Syslog()), unselected, model.ClassUnselected})
	}

	// 4. Address families: an IPv4 prefix never matches an IPv6 packet.
	mapped := func(a net.IP) net.IP {
		return net.IP(append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff}, a.To4()...))
	}
	cases = append(cases,
		verdictCase{"ipv6 from ::ffff:203.0.113.7 (exempt 203.0.113.0/24 is IPv4)", Serialize(t, eth6(), IPv6(mapped(net.IPv4(203, 0, 113, 7)), Dst6, layers.IPProtocolUDP), UDP(514), Syslog()), selected, model.ClassSelected},
		verdictCase{"ipv6 to ::ffff:198.51.100.1 (dests 198.51.100.0/24 is IPv4)", Serialize(t, eth6(), IPv6(Src6, mapped(Dst4), layers.IPProtocolUDP), UDP(5514), Syslog()), unselected, model.ClassUnselected},
	)

	// 5. Length fields that disagree with the frame.
	udp4 := UDP4(t, 514)
	udp6 := UDP6(t, 514)
	tcpOpts := Serialize(t, eth4(), IPv4(Src4, Dst4, layers.IPProtocolTCP), TCP(6514, true, false))
	hbh := Serialize(t, eth6(), ip6(layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolUDP), UDP(514), Syslog())
	cases = append(cases,
		verdictCase{"udp4/514 UDP length 4", with16(udp4, l4Off4+udpLen, 4), malformedAs(tiers.MalformedUDPLength), model.ClassMalformed},
		verdictCase{"udp4/514 UDP length past the IP payload", with16(udp4, l4Off4+udpLen, uint16(len(udp4)-l4Off4+1)), malformedAs(tiers.MalformedUDPLength), model.ClassMalformed},
		verdictCase{"udp4/514 UDP length short of the IP payload (the kernel trims)", with16(udp4, l4Off4+udpLen, 8), selected, model.ClassSelected},
		verdictCase{"udp6/514 UDP length 4", with16(udp6, l4Off6+udpLen, 4), malformedAs(tiers.MalformedUDPLength), model.ClassMalformed},
		verdictCase{"udp4/514 IP payload of 4 bytes", with16(udp4, ipv4Tot, 24), malformedAs(tiers.MalformedUDPLength), model.ClassMalformed},
		verdictCase{"ipv4 total length below IHL", with16(udp4, ipv4Tot, 19), malformedAs(tiers.MalformedIPv4Length), model.ClassMalformed},
		verdictCase{"ipv4 total length past the frame", with16(udp4, ipv4Tot, uint16(len(udp4)-l3Off+1)), malformedAs(tiers.MalformedIPv4Length), model.ClassMalformed},
		verdictCase{"udp4/514 with 20 bytes of trailer after the total length", append(append([]byte(nil), udp4...), make([]byte, 20)...), selected, model.ClassSelected},
		verdictCase{"ipv6 payload length past the frame", with16(udp6, ipv6Pay, uint16(len(udp6)-l4Off6+1)), malformedAs(tiers.MalformedIPv6Length), model.ClassMalformed},
		verdictCase{"ipv6 hop-by-hop past the payload length", with16(hbh, ipv6Pay, 4), malformedAs(tiers.MalformedIPv6Length), model.ClassMalformed},
		verdictCase{"tcp4/6514 syn data offset 4", withDoff(tcpOpts, l4Off4, 4), malformedAs(tiers.MalformedTCPLength), model.ClassMalformed},
		verdictCase{"tcp4/6514 syn data offset past the IP payload", withDoff(tcpOpts, l4Off4, 15), malformedAs(tiers.MalformedTCPLength), model.ClassMalformed},
		verdictCase{"tcp4/6514 syn IP payload of 12 bytes", with16(tcpOpts, ipv4Tot, 32), malformedAs(tiers.MalformedTCPLength), model.ClassMalformed},
	)
	return cases
}

// withDoff returns a copy of frame with the TCP data offset at l4 set to doff.
func withDoff(frame []byte, l4 int, doff byte) []byte {
	f := append([]byte(nil), frame...)
	f[l4+tcpDoff] = doff<<4 | f[l4+tcpDoff]&0x0f
	return f
}

// TestFragmentMemory is issue 10 §1: a remembered first-fragment verdict
// belongs to one datagram. It is replaced by the next first fragment with
// the same identity, it expires, and the identity holds the family and the
// protocol.
func TestFragmentMemory(t *testing.T) {
	h := newHarness(t, testPolicy(t))
	payload := gopacket.Payload(make([]byte, 64))
	first4 := func(dport, id uint16) []byte {
		return Serialize(t, Eth(layers.EthernetTypeIPv4), fragIPv4(layers.IPProtocolUDP, id, 0, true), UDP(dport), payload)
	}
	next4 := func(proto layers.IPProtocol, id uint16) []byte {
		return Serialize(t, Eth(layers.EthernetTypeIPv4), fragIPv4(proto, id, 10, false), payload)
	}
	step := func(what string, frame []byte, wantRet uint32, want delta) {
		t.Helper()
		s0, w0 := h.stats(), h.window()
		ret := h.run(frame)
		if d := diff(s0, h.stats(), w0, h.window()); d != want || ret != wantRet {
			t.Errorf("%s: action %d counters %+v, want %d %+v", what, ret, d, wantRet, want)
		}
	}

	// The case: a dropped UDP/514 first fragment, then, in a new
	// window, an unrelated UDP/53 datagram that reuses the id.
	h.preload(1_000_000_000)
	step("udp/514 first, saturated", first4(514, 0x5151), xdpDrop, selected)
	step("its follower", next4(layers.IPProtocolUDP, 0x5151), xdpDrop, fragDrop)
	h.expire()
	step("udp/53 first, same id", first4(53, 0x5151), xdpPass, unselected)
	step("udp/53 follower", next4(layers.IPProtocolUDP, 0x5151), xdpPass, fragPass)

	// A first fragment that passes replaces a drop as well.
	h.preload(1_000_000_000)
	step("udp/514 first, saturated", first4(514, 0x5152), xdpDrop, selected)
	h.preload(0)
	step("udp/514 first, same id, empty window", first4(514, 0x5152), xdpPass, selected)
	step("its follower", next4(layers.IPProtocolUDP, 0x5152), xdpPass, fragPass)
	h.preload(1_000_000_000)
	step("udp/514 first, saturated again", first4(514, 0x5152), xdpDrop, selected)

	// The protocol and the family are part of the identity.
	step("tcp follower with the dropped udp datagram's id", next4(layers.IPProtocolTCP, 0x5152), xdpPass, fragPass)
	mapped := func(a net.IP) net.IP {
		return net.IP(append(make([]byte, 10), append([]byte{0xff, 0xff}, a.To4()...)...))
	}
	v6 := Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(mapped(Src4), mapped(Dst4), layers.IPProtocolIPv6Fragment),
		&IPv6Fragment{NextHeader: layers.IPProtocolUDP, FragmentOffset: 10, Identification: 0x5152}, payload)
	step("ipv6 follower from the IPv4-mapped addresses, same id", v6, xdpPass, fragPass)

	// A verdict expires after bpf.FragmentTTL: age every entry past it.
	step("udp/514 first, saturated", first4(514, 0x5153), xdpDrop, selected)
	var (
		k bpf.LimiterTlFragKey
		v bpf.LimiterTlFragVerdict
	)
	m := h.l.FragVerdicts()
	now := monotonicNow(t)
	var keys []bpf.LimiterTlFragKey
	for it := m.Iterate(); it.Next(&k, &v); {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if err := m.Lookup(&k, &v); err != nil {
			t.Fatal(err)
		}
		if v.ExpiresNs > now+uint64(bpf.FragmentTTL) {
			t.Errorf("verdict expires %v from now, more than %v", time.Duration(v.ExpiresNs-now), bpf.FragmentTTL)
		}
		v.ExpiresNs = now - 1
		if err := m.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
	step("follower after the verdict expired", next4(layers.IPProtocolUDP, 0x5153), xdpPass, fragPass)
}

// TestAddressFamilies is issue 10 §4: ::/0 matches no IPv4 packet and an
// IPv4 prefix no IPv6 packet, in exempt sources and in select dests.
func TestAddressFamilies(t *testing.T) {
	p := ordinalDefault()
	p.Window = time.Hour
	p.Exempt = []netip.Prefix{netip.MustParsePrefix("::/0"), netip.MustParsePrefix("10.99.0.0/24")}
	p.Select = append(p.Select,
		tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 5514, Last: 5514}}, Dests: []netip.Prefix{netip.MustParsePrefix("::/0")}},
		tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 5515, Last: 5515}}, Dests: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
	)
	h := newHarness(t, p)
	h.preload(0)
	mapped := net.ParseIP("::ffff:10.99.0.1")
	for _, tc := range []struct {
		name  string
		frame []byte
		want  delta
	}{
		{"ipv4 udp/514, exempt ::/0", UDP4(t, 514), selected},
		{"ipv6 udp/514, exempt ::/0", UDP6(t, 514), exempt},
		{"ipv6 from ::ffff:10.99.0.1, exempt 10.99.0.0/24", Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(mapped, Dst6, layers.IPProtocolUDP), UDP(514), Syslog()), exempt},
		{"ipv4 udp/5514, dests ::/0", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(net.IPv4(192, 0, 2, 9).To4(), Dst4, layers.IPProtocolUDP), UDP(5514), Syslog()), unselected},
		{"ipv6 udp/5515, dests 0.0.0.0/0", Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolUDP), UDP(5515), Syslog()), unselected},
	} {
		if c := model.Classify(h.p, tc.frame); wantDelta(c) != tc.want {
			t.Errorf("%s: classifier says %v, want %+v", tc.name, c.Class, tc.want)
		}
		// Five of each, as in the issue.
		for range 5 {
			s0, w0 := h.stats(), h.window()
			h.run(tc.frame)
			if d := diff(s0, h.stats(), w0, h.window()); d != tc.want {
				t.Errorf("%s: counters %+v, want %+v", tc.name, d, tc.want)
				break
			}
		}
	}
}
