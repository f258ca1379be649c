package bpf_test

import (
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// hostFrame is a UDP/514 datagram, or a TCP SYN to 601, from src to dst,
// to the destination MAC dmac, through the IPv6 extension headers exts.
func hostFrame(tb testing.TB, dmac net.HardwareAddr, src, dst string, tcp bool, exts ...layers.IPProtocol) []byte {
	tb.Helper()
	s, d := net.ParseIP(src), net.ParseIP(dst)
	l4 := layers.IPProtocolUDP
	var l4l gopacket.SerializableLayer = UDP(514)
	if tcp {
		l4, l4l = layers.IPProtocolTCP, TCP(601, true, false)
	}
	var ls []gopacket.SerializableLayer
	if s.To4() != nil && d.To4() != nil {
		eth := Eth(layers.EthernetTypeIPv4)
		eth.DstMAC = dmac
		ls = []gopacket.SerializableLayer{eth, IPv4(s.To4(), d.To4(), l4)}
	} else {
		eth := Eth(layers.EthernetTypeIPv6)
		eth.DstMAC = dmac
		next := l4
		if len(exts) > 0 {
			next = exts[0]
		}
		ls = []gopacket.SerializableLayer{eth, IPv6(s, d, next)}
		for i := range exts {
			nh := l4
			if i+1 < len(exts) {
				nh = exts[i+1]
			}
			ls = append(ls, &ExtHeader{NextHeader: nh})
		}
	}
	return Serialize(tb, append(ls, l4l, Syslog())...)
}

// TestKernelDiscards runs crafted frames through the program
// (BPF_PROG_TEST_RUN, on the test namespace's lo, which SetIfaces
// describes as the agent would an Ethernet interface) beside the
// reference model model.ClassifyOn: a frame Linux certainly discards
// (bpf/host.h: another host's MAC, martians; a hop-by-hop header that is
// not the first) passes uncounted as unselected; its neighbours that
// Linux delivers are counted.
func TestKernelDiscards(t *testing.T) {
	all := model.Iface{MAC: [6]byte(DstMAC), CheckMAC: true, Martians: true, LocalnetMartian: true}
	noMAC, noLocalnet, none := all, all, model.Iface{}
	noMAC.CheckMAC, noLocalnet.LocalnetMartian = false, false
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	mc6 := net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	hbh, dst := layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Destination
	h := newHarness(t, ordinalDefault())
	for _, c := range []struct {
		name     string
		ifc      model.Iface
		frame    []byte
		selected bool
	}{
		{"to the interface's MAC", all, hostFrame(t, DstMAC, "192.0.2.1", "198.51.100.1", false), true},
		{"another host's MAC", all, hostFrame(t, other, "192.0.2.1", "198.51.100.1", false), false},
		{"another host's MAC, IPv6 SYN", all, hostFrame(t, other, "2001:db8::1", "2001:db8::2", true), false},
		{"another host's MAC, not checked", noMAC, hostFrame(t, other, "192.0.2.1", "198.51.100.1", false), true},
		{"another host's MAC, interface undescribed", none, hostFrame(t, other, "192.0.2.1", "198.51.100.1", false), true},
		{"broadcast MAC", all, hostFrame(t, bcast, "192.0.2.1", "198.51.100.255", false), true},
		{"multicast MAC", all, hostFrame(t, mc6, "2001:db8::1", "ff02::1", false), true},
		{"source 224.0.0.5", all, hostFrame(t, DstMAC, "224.0.0.5", "198.51.100.1", false), false},
		{"source 255.255.255.255", all, hostFrame(t, DstMAC, "255.255.255.255", "198.51.100.1", false), false},
		{"source 0.0.0.0", all, hostFrame(t, DstMAC, "0.0.0.0", "198.51.100.1", false), false},
		{"source 0.1.2.3 (unicast since Linux 5.3)", all, hostFrame(t, DstMAC, "0.1.2.3", "198.51.100.1", false), true},
		{"source 0.0.0.0 to 255.255.255.255", all, hostFrame(t, bcast, "0.0.0.0", "255.255.255.255", false), true},
		{"source 0.1.2.3 to 255.255.255.255", all, hostFrame(t, bcast, "0.1.2.3", "255.255.255.255", false), true},
		{"0.0.0.0 to 0.0.0.0", all, hostFrame(t, DstMAC, "0.0.0.0", "0.0.0.0", false), true},
		{"source 0.0.0.0 to 224.0.0.9", all, hostFrame(t, DstMAC, "0.0.0.0", "224.0.0.9", false), true},
		{"source 0.0.0.0 to 239.1.2.3", all, hostFrame(t, DstMAC, "0.0.0.0", "239.1.2.3", false), false},
		{"to 0.0.0.0", all, hostFrame(t, DstMAC, "192.0.2.1", "0.0.0.0", false), false},
		{"source 0.1.2.3 to 239.1.2.3", all, hostFrame(t, DstMAC, "0.1.2.3", "239.1.2.3", false), true},
		{"source 127.0.0.1", all, hostFrame(t, DstMAC, "127.0.0.1", "198.51.100.1", false), false},
		{"to 127.0.0.1", all, hostFrame(t, DstMAC, "192.0.2.1", "127.0.0.1", false), false},
		{"source 127.0.0.1 to 239.1.2.3", all, hostFrame(t, DstMAC, "127.0.0.1", "239.1.2.3", false), false},
		{"source 127.0.0.1, route_localnet on", noLocalnet, hostFrame(t, DstMAC, "127.0.0.1", "198.51.100.1", false), true},
		{"to 127.0.0.1, route_localnet on", noLocalnet, hostFrame(t, DstMAC, "192.0.2.1", "127.0.0.1", false), true},
		{"source 240.0.0.1 (class E)", all, hostFrame(t, DstMAC, "240.0.0.1", "198.51.100.1", false), true},
		{"source 224.0.0.5, MAC unchecked", noMAC, hostFrame(t, DstMAC, "224.0.0.5", "198.51.100.1", false), false},
		{"source 224.0.0.5, interface undescribed", none, hostFrame(t, DstMAC, "224.0.0.5", "198.51.100.1", false), true},
		{"IPv6 source ff02::1", all, hostFrame(t, DstMAC, "ff02::1", "2001:db8::2", false), false},
		{"IPv6 source ::1", all, hostFrame(t, DstMAC, "::1", "2001:db8::2", false), false},
		{"IPv6 to ::1", all, hostFrame(t, DstMAC, "2001:db8::1", "::1", false), false},
		{"IPv6 to ff01::1 (interface-local)", all, hostFrame(t, mc6, "2001:db8::1", "ff01::1", false), false},
		{"IPv6 to ff00::1 (scope 0)", all, hostFrame(t, mc6, "2001:db8::1", "ff00::1", false), false},
		{"IPv6 to ff02::1", all, hostFrame(t, mc6, "2001:db8::1", "ff02::1", false), true},
		{"IPv6 SYN from ::ffff:192.0.2.1", all, hostFrame(t, DstMAC, "::ffff:192.0.2.1", "2001:db8::2", true), false},
		{"IPv6 UDP from ::ffff:192.0.2.1", all, hostFrame(t, DstMAC, "::ffff:192.0.2.1", "2001:db8::2", false), true},
		{"IPv6 UDP from ::ffff:127.0.0.1", all, hostFrame(t, DstMAC, "::ffff:127.0.0.1", "2001:db8::2", false), true},
		{"TCP SYN to 255.255.255.255", all, hostFrame(t, bcast, "192.0.2.1", "255.255.255.255", true), false},
		{"TCP SYN 0.0.0.0 to 0.0.0.0", all, hostFrame(t, DstMAC, "0.0.0.0", "0.0.0.0", true), false},
		{"TCP SYN to 224.0.0.1", all, hostFrame(t, DstMAC, "192.0.2.1", "224.0.0.1", true), false},
		{"IPv6 TCP SYN to ff02::1", all, hostFrame(t, mc6, "2001:db8::1", "ff02::1", true), false},
		{"IPv6 UDP from ::", all, hostFrame(t, DstMAC, "::", "2001:db8::2", false), true},
		{"VLAN 42, no VLAN device", all, withTags(hostFrame(t, DstMAC, "192.0.2.1", "198.51.100.1", false), 0x8100, 42), false},
		{"VLAN 42, IPv6 SYN", all, withTags(hostFrame(t, DstMAC, "2001:db8::1", "2001:db8::2", true), 0x88a8, 42), false},
		{"VLAN 0 (a priority tag)", all, withTags(hostFrame(t, DstMAC, "192.0.2.1", "198.51.100.1", false), 0x8100, 0), true},
		{"VLAN 0 then 42", all, withTags(hostFrame(t, DstMAC, "192.0.2.1", "198.51.100.1", false), 0x8100, 0, 42), false},
		{"VLAN 4095 behind 0, IPv6", all, withTags(hostFrame(t, DstMAC, "2001:db8::1", "2001:db8::2", false), 0x88a8, 0, 4095), false},
		{"VLAN 42, MAC unchecked (a device may sit on it)", noMAC, withTags(hostFrame(t, DstMAC, "192.0.2.1", "198.51.100.1", false), 0x8100, 42), true},
		{"three VLAN 0 tags: too deep, judged as selected", all, withTags(hostFrame(t, DstMAC, "192.0.2.1", "198.51.100.1", false), 0x8100, 0, 0, 0), true},
		{"VLAN 0, 42, 0: too deep, the second discards", all, withTags(hostFrame(t, DstMAC, "192.0.2.1", "198.51.100.1", false), 0x8100, 0, 42, 0), false},
		{"hop-by-hop first", none, hostFrame(t, DstMAC, "2001:db8::1", "2001:db8::2", false, hbh, dst), true},
		{"hop-by-hop second", none, hostFrame(t, DstMAC, "2001:db8::1", "2001:db8::2", false, dst, hbh), false},
		{"hop-by-hop twice", none, hostFrame(t, DstMAC, "2001:db8::1", "2001:db8::2", false, hbh, hbh), false},
		{"hop-by-hop seventh", none, hostFrame(t, DstMAC, "2001:db8::1", "2001:db8::2", false, dst, dst, dst, dst, dst, dst, hbh), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// One program for every case (each load costs the verifier
			// a few seconds): SetIfaces rewrites every slot, and the
			// counts are read as differences, far below the window's max.
			if _, err := h.l.SetIfaces(describe(c.ifc)); err != nil {
				t.Fatal(err)
			}
			modelSel := model.ClassifyOn(h.p, c.ifc, c.frame).Class == model.ClassSelected
			s0 := h.stats()
			if act := h.run(c.frame); act != xdpPass {
				t.Errorf("action %d, want XDP_PASS", act)
			}
			s1 := h.stats()
			got := s1.SelectedPackets() != s0.SelectedPackets()
			unsel := s1.Unselected.Packets - s0.Unselected.Packets
			if got != c.selected || modelSel != c.selected || got == (unsel == 1) {
				t.Errorf("counted %v, unselected +%d, model selects %v; want counted %v", got, unsel, modelSel, c.selected)
			}
		})
	}
}

// describe is what SetIfaces takes for the test namespace's lo (ifindex
// 1, where BPF_PROG_TEST_RUN runs the program) described as ifc.
func describe(ifc model.Iface) []bpf.Iface {
	if ifc == (model.Iface{}) {
		return nil
	}
	return []bpf.Iface{{Index: 1, MAC: ifc.MAC[:], CheckMAC: ifc.CheckMAC, Martians: ifc.Martians, LocalnetMartian: ifc.LocalnetMartian}}
}

// TestIfaceSlots checks that an interface whose slot (ifindex %
// bpf.IfaceSlots) another one holds is left unchecked, and that the
// program then counts its frames: the slot's entry is not read for it.
func TestIfaceSlots(t *testing.T) {
	h := newHarness(t, ordinalDefault())
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	frame := hostFrame(t, other, "192.0.2.1", "198.51.100.1", false)
	for _, c := range []struct {
		name    string
		ifs     []bpf.Iface
		counted bool
	}{
		{"lo described", []bpf.Iface{{Index: 1, MAC: DstMAC, CheckMAC: true}}, false},
		{"lo's slot held by another", []bpf.Iface{{Index: 1 + bpf.IfaceSlots, MAC: DstMAC, CheckMAC: true}, {Index: 1, MAC: DstMAC, CheckMAC: true}}, true},
		{"none", nil, true},
	} {
		unchecked, err := h.l.SetIfaces(c.ifs)
		if err != nil {
			t.Fatal(err)
		}
		if want := len(c.ifs) == 2; (len(unchecked) == 1 && unchecked[0] == 1) != want {
			t.Errorf("%s: left unchecked %v", c.name, unchecked)
		}
		s0 := h.stats()
		h.run(frame)
		s1 := h.stats()
		if got := s1.SelectedPackets() != s0.SelectedPackets(); got != c.counted {
			t.Errorf("%s: a frame to another MAC on lo counted %v, want %v", c.name, got, c.counted)
		}
	}
}
