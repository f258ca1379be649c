package bpf_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestMulticastJoinedOnly (issue 33 item 3; docs/design.md §2, dests:
// local), with the kernel as the oracle: the collector has a UDP socket on
// port 514 of each family that joined one group on its veth (ff05::514,
// 239.1.2.3), and the program is attached there in native mode with the
// default rules, dests: local resolved as the agent resolves it (the
// groups joined, not multicast whole). A datagram to a joined group, or to
// one the kernel joins itself (all-nodes ff02::1, all-hosts 224.0.0.1), is
// delivered and counted; one to a group no one joined (ff05::999,
// 239.9.9.9) is not delivered (ip6_mc_input, ip_route_input_rcu) and not
// counted.
func TestMulticastJoinedOnly(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	var (
		joined6, other6 = netip.MustParseAddr("ff05::514"), netip.MustParseAddr("ff05::999")
		joined4, other4 = netip.MustParseAddr("239.1.2.3"), netip.MustParseAddr("239.9.9.9")
		collIdx         int
		rx4, rx6        net.PacketConn
	)
	if err := p.Coll.Do(func() error {
		lk, err := netlink.LinkByName(p.CollIf)
		if err != nil {
			return err
		}
		collIdx = lk.Attrs().Index
		if rx6, err = joinedSocket(unix.AF_INET6, joined6, collIdx); err != nil {
			return err
		}
		rx4, err = joinedSocket(unix.AF_INET, joined4, collIdx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx4.Close(); rx6.Close() })
	var tx4, tx6 int
	if err := p.Send.Do(func() error {
		lk, err := netlink.LinkByName(p.SendIf)
		if err != nil {
			return err
		}
		if tx6, err = multicastSender(unix.AF_INET6, lk.Attrs().Index); err != nil {
			return err
		}
		tx4, err = multicastSender(unix.AF_INET, lk.Attrs().Index)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(tx4); unix.Close(tx6) })

	local := waitLocalDests(t, p.Coll, netip.PrefixFrom(joined6, 128), netip.PrefixFrom(joined4, 32))
	room := ordinalDefault()
	room.Window, room.Max = time.Hour, 1_000_000
	h := newHarness(t, room.WithLocal(local))
	attachNative(t, p.Coll, h.l, collIdx)

	const n = 20
	for _, c := range []struct {
		group     netip.Addr
		delivered bool
	}{
		{joined6, true}, {other6, false}, {netip.MustParseAddr("ff02::1"), true},
		{joined4, true}, {other4, false}, {netip.MustParseAddr("224.0.0.1"), true},
	} {
		tx, rx := tx6, rx6
		var sa unix.Sockaddr = &unix.SockaddrInet6{Port: 514, Addr: c.group.As16()}
		if c.group.Is4() {
			tx, rx = tx4, rx4
			sa = &unix.SockaddrInet4{Port: 514, Addr: c.group.As4()}
		}
		s0 := h.stats()
		for i := range n {
			if err := unix.Sendto(tx, testenv.SyslogMessage(0, i), 0, sa); err != nil {
				t.Fatalf("send to %v: %v", c.group, err)
			}
		}
		got := drainCount(rx, 300*time.Millisecond)
		s1 := h.stats()
		sel, unsel := s1.SelectedPackets()-s0.SelectedPackets(), s1.Unselected.Packets-s0.Unselected.Packets
		want := 0
		if c.delivered {
			want = n
		}
		if got != want {
			t.Errorf("to %v: the kernel delivered %d of %d, want %d", c.group, got, n, want)
		}
		// Unselected may hold more: the namespaces' own MLD and ND.
		if int(sel) != want || int(unsel) < n-want {
			t.Errorf("to %v: %d of %d counted, %d unselected; want %d counted, as delivered", c.group, sel, n, unsel, want)
		}
	}
}

// joinedSocket is a UDP socket of family bound to port 514 of any
// address, which joined group on the interface of ifindex.
func joinedSocket(family int, group netip.Addr, ifindex int) (net.PacketConn, error) {
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "joined")
	defer f.Close() // FilePacketConn holds a dup
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if family == unix.AF_INET6 {
		unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
		if err := unix.Bind(fd, &unix.SockaddrInet6{Port: 514}); err != nil {
			return nil, err
		}
		mreq := &unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(ifindex)}
		if err := unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, mreq); err != nil {
			return nil, fmt.Errorf("join %v: %w", group, err)
		}
	} else {
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 514}); err != nil {
			return nil, err
		}
		mreq := &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)}
		if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, mreq); err != nil {
			return nil, fmt.Errorf("join %v: %w", group, err)
		}
	}
	return net.FilePacketConn(f)
}

// multicastSender is a UDP socket of family that sends multicast out of
// the interface of ifindex.
func multicastSender(family, ifindex int) (int, error) {
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if family == unix.AF_INET6 {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ifindex)
	} else {
		err = unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(ifindex)})
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// drainCount reads c until it has been quiet for quiet (at most 5 s in all)
// and returns how many datagrams it read.
func drainCount(c net.PacketConn, quiet time.Duration) int {
	buf := make([]byte, 2048)
	n := 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		c.SetReadDeadline(time.Now().Add(quiet))
		if _, _, err := c.ReadFrom(buf); err != nil {
			return n
		}
		n++
	}
	return n
}
