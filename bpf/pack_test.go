package bpf_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestPackedFields is the round trip of parse.h's pkt_pack and pkt_unpack,
// the header fields the entry point hands tl_judge in two scalars. Every
// frame is QinQ-tagged (the L3 header at 22, not 14), and each row turns
// on at least one packed field, named in the row: a field packed or
// unpacked at the wrong bits changes that row's action or counters.
func TestPackedFields(t *testing.T) {
	const highPort = 65534 // dport's top bits set
	p := testPolicy(t)
	p.Select = append(p.Select, tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: highPort, Last: highPort}},
		Dests: []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr(Dst6.String()), 128)}})
	p.Severity = &tiers.Severity{Protect: []int{3}, ProtectBudget: tiers.Pct(5)}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, p)

	qinq := func(next layers.EthernetType) []gopacket.SerializableLayer {
		return []gopacket.SerializableLayer{Eth(layers.EthernetTypeQinQ),
			&layers.Dot1Q{VLANIdentifier: 42, Type: layers.EthernetTypeDot1Q},
			&layers.Dot1Q{VLANIdentifier: 43, Type: next}}
	}
	frame := func(next layers.EthernetType, ls ...gopacket.SerializableLayer) []byte {
		return Serialize(t, append(qinq(next), ls...)...)
	}
	const id = 0xfedcba98 // frag_id: all 32 bits, above IPv4's 16
	v6frag := func(off uint16, more bool) []byte {
		return frame(layers.EthernetTypeIPv6, IPv6(Src6, Dst6, layers.IPProtocolIPv6Fragment),
			&IPv6Fragment{NextHeader: layers.IPProtocolUDP, FragmentOffset: off, MoreFragments: more, Identification: id},
			UDP(highPort), gopacket.Payload("<3>first fragment"))
	}
	exemptSrc := net.IPv4(203, 0, 113, 7).To4()

	for _, c := range []struct {
		name      string
		saturated bool
		frame     []byte
		ret       uint32
		want      delta
		class     int // severity class counted, -1 for none
	}{
		{"l3 offset, ipv6 bit, l4proto, dport: udp6/65534 to its dest prefix", false,
			frame(layers.EthernetTypeIPv6, IPv6(Src6, Dst6, layers.IPProtocolUDP), UDP(highPort), gopacket.Payload("x")),
			xdpPass, selected, int(tiers.SevNormal)},
		{"l3 offset, ipv4: udp4/514 from an exempt source", false,
			frame(layers.EthernetTypeIPv4, IPv4(exemptSrc, Dst4, layers.IPProtocolUDP), UDP(514), Syslog()),
			xdpPass, exempt, -1},
		{"l4proto, syn: tcp4/6514 syn", false,
			frame(layers.EthernetTypeIPv4, IPv4(Src4, Dst4, layers.IPProtocolTCP), TCP(6514, true, false)),
			xdpPass, selected, -1},
		{"syn: tcp4/6514 syn-ack is not counted", false,
			frame(layers.EthernetTypeIPv4, IPv4(Src4, Dst4, layers.IPProtocolTCP), TCP(6514, true, true)),
			xdpPass, unselected, -1},
		{"payload offset: udp6/514 <3> after a fragment header", false,
			frame(layers.EthernetTypeIPv6, IPv6(Src6, Dst6, layers.IPProtocolIPv6Fragment),
				&IPv6Fragment{NextHeader: layers.IPProtocolUDP, Identification: 7}, UDP(514), gopacket.Payload("<3>x")),
			xdpPass, selected, int(tiers.SevProtected)},
		{"frag, frag_proto, frag_id: first fragment dropped", true, v6frag(0, true), xdpDrop, selected, int(tiers.SevProtected)},
		{"its follower takes the drop", true, v6frag(10, false), xdpDrop, fragDrop, -1},
	} {
		// Saturated, every packet is dropped: protection's budget is spent
		// so that it passes none of them.
		w := h.window()
		w.Count, w.Debt = 0, 0
		if c.saturated {
			w.Count, w.Debt = 1_000_000_000, 1<<40
		}
		w.StartNs, w.StartJiffies = monotonicNow(t), 0
		if err := h.l.SetWindow(w); err != nil {
			t.Fatal(err)
		}
		s0, w0 := h.stats(), h.window()
		ret := h.run(c.frame)
		s1 := h.stats()
		if d := diff(s0, s1, w0, h.window()); d != c.want || ret != c.ret {
			t.Errorf("%s: action %d counters %+v, want %d %+v", c.name, ret, d, c.ret, c.want)
		}
		if got := classMoved(s0, s1); got != c.class {
			t.Errorf("%s: severity class %d counted, want %d", c.name, got, c.class)
		}
	}
}
