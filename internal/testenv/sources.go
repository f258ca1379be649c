package testenv

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// AddAddr adds pfx (an address and its prefix length) to iface inside ns,
// without duplicate address detection, so that senders can use it as their
// source at once. Deleting the namespace removes it.
func AddAddr(tb testing.TB, ns *NS, iface string, pfx netip.Prefix) {
	tb.Helper()
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen())}}
		addr.Flags |= unix.IFA_F_NODAD
		return netlink.AddrAdd(l, addr)
	})
	if err != nil {
		tb.Fatalf("add %s to %s in %s: %v", pfx, iface, ns.Name, err)
	}
}

// NewSenderFrom is NewSender with the socket bound to source address src
// (which must be on an interface of ns, see AddAddr).
func NewSenderFrom(tb testing.TB, ns *NS, src netip.Addr, dst netip.AddrPort) *Sender {
	tb.Helper()
	s := &Sender{dst: dst}
	err := ns.Do(func() error {
		var err error
		s.conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		return err
	})
	if err != nil {
		tb.Fatalf("sender from %s in %s: %v", src, ns.Name, err)
	}
	tb.Cleanup(func() { s.conn.Close() })
	return s
}
