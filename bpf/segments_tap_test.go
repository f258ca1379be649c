package bpf_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// include/uapi/linux/virtio_net.h: struct virtio_net_hdr (10 bytes, the
// tap's default vnet header size) and the values the test writes in it.
const (
	vnetHdrLen        = 10
	vnetNeedsCsum     = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	vnetGSOUDPL4      = 5 // VIRTIO_NET_HDR_GSO_UDP_L4
	tapAddr, tapPeer  = "192.0.2.1", "192.0.2.2"
	tapSegment        = 100 // gso_size: each datagram's payload, bytes
	tapSyslogPriority = "<14>"
)

// TestTapSuperPackets is issue 43: a UDP GSO super-packet written to a tap
// device with a vnet header (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, gso_type
// UDP_L4) reaches generic XDP with gso_segs 0 (virtio_net_hdr_to_skb marks
// it SKB_GSO_DODGY, for the kernel to count when it segments it); the
// program must count the datagrams the socket receives, not 1, in both
// shapes, and their payload bytes (passed_bytes_total) as the socket
// receives them.
func TestTapSuperPackets(t *testing.T) {
	testenv.Require(t)
	for _, shape := range []tiers.Shape{tiers.ShapeOrdinal, tiers.ShapeSmooth} {
		t.Run(shape.String(), func(t *testing.T) { tapSuperPackets(t, shape) })
	}
}

func tapSuperPackets(t *testing.T, shape tiers.Shape) {
	ns := testenv.NewNS(t)
	var tap int
	var idx int
	var mac net.HardwareAddr
	if err := ns.Do(func() (err error) {
		tap, idx, mac, err = openTap("tltap0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(tap) })

	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	pol := ordinalDefault()
	pol.Shape = shape
	pol.Window, pol.Max = time.Hour, 100_000_000
	pol.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 514, Last: 514}}}}
	tab, err := tiers.Compile(pol, l.Tick())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(context.Background(), tab); err != nil {
		t.Fatal(err)
	}
	if err := ns.Do(func() error {
		lk, err := link.AttachXDP(link.XDPOptions{Program: l.Program(), Interface: idx, Flags: link.XDPGenericMode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { lk.Close() })
		return l.SetSKBIfaces([]int{idx})
	}); err != nil {
		t.Fatal(err)
	}
	rx := testenv.NewReceiver(t, ns, netip.AddrPortFrom(netip.MustParseAddr(tapAddr), 514))

	s0, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// Super-packets of 20 whole datagrams, and of 7 and a short one.
	sizes := []int{20 * tapSegment, 7*tapSegment + 37, 20 * tapSegment, 3 * tapSegment}
	want := 0
	for _, size := range sizes {
		want += (size + tapSegment - 1) / tapSegment
		if _, err := unix.Write(tap, tapSuperPacket(t, mac, size)); err != nil {
			t.Fatalf("write a %d-byte super-packet to the tap: %v", size, err)
		}
	}
	rx.WaitTotal(want, 10*time.Second)
	rx.WaitQuiet(300*time.Millisecond, 5*time.Second)
	_, got := rx.Counts()
	s1, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	counted := s1.SelectedPackets() - s0.SelectedPackets()
	t.Logf("%d super-packets through a tap: the socket received %d datagrams (%d sent), the program counted %d", len(sizes), got, want, counted)
	if got != want {
		t.Fatalf("the socket received %d datagrams, want %d: the kernel did not segment the super-packets as the test expects", got, want)
	}
	if counted != uint64(got) {
		t.Errorf("the program counted %d datagrams of %d super-packets, the socket received %d", counted, len(sizes), got)
	}
	// Their payload (count: bytes weighs them so, docs/design.md §2): the
	// bytes recvmsg returned of the segments.
	if _, bytes := rx.Bytes(); s1.PassedBytes()-s0.PassedBytes() != uint64(bytes) {
		t.Errorf("the program counted %d payload bytes of the super-packets, the socket received %d", s1.PassedBytes()-s0.PassedBytes(), bytes)
	}
}

// openTap creates the tap device name with vnet headers in the calling
// thread's namespace, addressed tapAddr/24 and up, and returns its file
// descriptor, index and MAC address.
func openTap(name string) (int, int, net.HardwareAddr, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0, nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	var lk netlink.Link
	if err == nil {
		lk, err = netlink.LinkByName(name)
	}
	if err == nil {
		err = netlink.AddrAdd(lk, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(tapAddr), Mask: net.CIDRMask(24, 32)}})
	}
	if err == nil {
		err = netlink.LinkSetUp(lk)
	}
	if err != nil {
		unix.Close(fd)
		return -1, 0, nil, fmt.Errorf("tap %s: %w", name, err)
	}
	return fd, lk.Attrs().Index, lk.Attrs().HardwareAddr, nil
}

// tapSuperPacket is a vnet header and the frame of one UDP GSO super-packet
// of size payload bytes (syslog datagrams of tapSegment bytes, the last
// one shorter when size is not a multiple) from tapPeer to tapAddr:514,
// checksum offloaded (NEEDS_CSUM at the UDP header), as a guest's
// virtio-net would write it.
func tapSuperPacket(tb testing.TB, dst net.HardwareAddr, size int) []byte {
	pl := []byte(strings.Repeat("x", size))
	for off := 0; off < size; off += tapSegment {
		copy(pl[off:], tapSyslogPriority)
	}
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
	ip := testenv.IPv4(net.ParseIP(tapPeer).To4(), net.ParseIP(tapAddr).To4(), layers.IPProtocolUDP)
	frame := testenv.Serialize(tb, eth, ip, testenv.UDP(514), gopacket.Payload(pl))
	l4 := len(frame) - size - 8
	hdr := make([]byte, vnetHdrLen)
	hdr[0] = vnetNeedsCsum
	hdr[1] = vnetGSOUDPL4
	binary.LittleEndian.PutUint16(hdr[2:], uint16(l4+8)) // hdr_len: headers up to the payload
	binary.LittleEndian.PutUint16(hdr[4:], tapSegment)   // gso_size
	binary.LittleEndian.PutUint16(hdr[6:], uint16(l4))   // csum_start: the UDP header
	binary.LittleEndian.PutUint16(hdr[8:], 6)            // csum_offset: udphdr.check
	return append(hdr, frame...)
}
