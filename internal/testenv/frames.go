package testenv

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Test addresses, from the documentation ranges (RFC 5737, RFC 3849).
var (
	SrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	DstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
	Src4   = net.IPv4(192, 0, 2, 1).To4()
	Dst4   = net.IPv4(198, 51, 100, 1).To4()
	Src6   = net.ParseIP("2001:db8::1")
	Dst6   = net.ParseIP("2001:db8::2")
)

// Serialize builds a frame from layers with lengths and checksums fixed.
func Serialize(tb testing.TB, ls ...gopacket.SerializableLayer) []byte {
	tb.Helper()
	for _, l := range ls {
		switch t := l.(type) {
		case *layers.UDP:
			setNet(t, ls)
		case *layers.TCP:
			setNet(t, ls)
		case *layers.ICMPv6:
			setNet(t, ls)
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		tb.Fatalf("serialize frame: %v", err)
	}
	return buf.Bytes()
}

func setNet(l interface {
	SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
}, ls []gopacket.SerializableLayer) {
	for _, x := range ls {
		if n, ok := x.(gopacket.NetworkLayer); ok {
			_ = l.SetNetworkLayerForChecksum(n)
		}
	}
}

// Eth is an Ethernet header carrying etype.
func Eth(etype layers.EthernetType) *layers.Ethernet {
	return &layers.Ethernet{SrcMAC: SrcMAC, DstMAC: DstMAC, EthernetType: etype}
}

// IPv4 is an IPv4 header from src to dst carrying proto.
func IPv4(src, dst net.IP, proto layers.IPProtocol) *layers.IPv4 {
	return &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Id: 0x1234, Protocol: proto, SrcIP: src, DstIP: dst}
}

// IPv6 is an IPv6 header from src to dst whose next header is next.
func IPv6(src, dst net.IP, next layers.IPProtocol) *layers.IPv6 {
	return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: next, SrcIP: src, DstIP: dst}
}

// UDP is a UDP header to dport.
func UDP(dport uint16) *layers.UDP {
	return &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(dport)}
}

// TCP is a TCP header to dport with the SYN and ACK flags given.
func TCP(dport uint16, syn, ack bool) *layers.TCP {
	return &layers.TCP{SrcPort: 40000, DstPort: layers.TCPPort(dport), Seq: 1, SYN: syn, ACK: ack, Window: 1024}
}

// Syslog is an RFC 5424 message, as a collector would receive it.
func Syslog() gopacket.Payload {
	return gopacket.Payload("<134>1 2026-11-29T17:00:00Z host app 1 ID47 - tierlimit test message")
}

// UDP4 is a syslog datagram over IPv4 to dport.
func UDP4(tb testing.TB, dport uint16) []byte {
	return Serialize(tb, Eth(layers.EthernetTypeIPv4), IPv4(Src4, Dst4, layers.IPProtocolUDP), UDP(dport), Syslog())
}

// UDP6 is a syslog datagram over IPv6 to dport.
func UDP6(tb testing.TB, dport uint16) []byte {
	return Serialize(tb, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolUDP), UDP(dport), Syslog())
}

// TCP4 is a TCP segment over IPv4 to dport.
func TCP4(tb testing.TB, dport uint16, syn, ack bool) []byte {
	return Serialize(tb, Eth(layers.EthernetTypeIPv4), IPv4(Src4, Dst4, layers.IPProtocolTCP), TCP(dport, syn, ack))
}

// IPv6Fragment is the IPv6 fragment extension header (RFC 8200 §4.5),
// which gopacket decodes but cannot serialize.
type IPv6Fragment struct {
	NextHeader     layers.IPProtocol
	FragmentOffset uint16 // in 8-byte units
	MoreFragments  bool
	Identification uint32
}

// LayerType implements gopacket.SerializableLayer.
func (f *IPv6Fragment) LayerType() gopacket.LayerType { return layers.LayerTypeIPv6Fragment }

// SerializeTo implements gopacket.SerializableLayer.
func (f *IPv6Fragment) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(8)
	if err != nil {
		return err
	}
	h[0] = byte(f.NextHeader)
	h[1] = 0
	off := f.FragmentOffset << 3
	if f.MoreFragments {
		off |= 1
	}
	binary.BigEndian.PutUint16(h[2:], off)
	binary.BigEndian.PutUint32(h[4:], f.Identification)
	return nil
}
