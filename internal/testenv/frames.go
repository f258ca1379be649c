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

// AH is an IP Authentication Header (RFC 4302) with an ICV of ICVLen
// bytes, after IPv4 or in an IPv6 extension-header chain. gopacket decodes
// it but cannot serialize it. Its length field counts 4-byte words minus
// 2: 12 fixed bytes and a 12-byte ICV make 24 bytes, length 4.
type AH struct {
	NextHeader layers.IPProtocol
	ICVLen     int // a multiple of 4 (of 8 in IPv6 with the 12 fixed bytes)
}

// LayerType implements gopacket.SerializableLayer.
func (a *AH) LayerType() gopacket.LayerType { return layers.LayerTypeIPSecAH }

// SerializeTo implements gopacket.SerializableLayer.
func (a *AH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	size := 12 + a.ICVLen
	h, err := b.PrependBytes(size)
	if err != nil {
		return err
	}
	clear(h)
	h[0] = byte(a.NextHeader)
	h[1] = byte(size/4 - 2)
	binary.BigEndian.PutUint32(h[4:], 0x1000) // SPI
	binary.BigEndian.PutUint32(h[8:], 1)      // sequence number
	return nil
}

// ExtHeader is an IPv6 extension header in the generic format (next
// header, length in 8-byte units minus 1, then zeros), for next-header
// values that gopacket cannot serialize: routing, Mobility, HIP, Shim6,
// the experimental 253 and 254. Size is its length in bytes, a multiple
// of 8 (0 means 8).
type ExtHeader struct {
	NextHeader layers.IPProtocol
	Size       int
}

// LayerType implements gopacket.SerializableLayer.
func (e *ExtHeader) LayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

// SerializeTo implements gopacket.SerializableLayer.
func (e *ExtHeader) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	size := max(e.Size, 8)
	h, err := b.PrependBytes(size)
	if err != nil {
		return err
	}
	clear(h)
	h[0] = byte(e.NextHeader)
	h[1] = byte(size/8 - 1)
	return nil
}
