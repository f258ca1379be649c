package automax

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestDropSource overflows a UDP socket with a tiny receive buffer inside a
// namespace of its own (so no other socket's drops count) and checks that
// both signals report exactly the datagrams the kernel did not queue, that
// a port without a socket reads as no socket, and that a socket that
// closes and comes back (a collector restart) is picked up.
func TestDropSource(t *testing.T) {
	testenv.Require(t)
	ns := testenv.NewNS(t)
	for _, snmpOnly := range []bool{false, true} {
		want := map[bool]string{false: SignalSockDiag, true: SignalSNMP}[snmpOnly]
		t.Run(want, func(t *testing.T) {
			var src DropSource
			if err := ns.Do(func() (err error) { src, err = OpenDropSource(snmpOnly); return err }); err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			if src.Signal() != want {
				t.Fatalf("Signal() = %q, want %q", src.Signal(), want)
			}
			ports := []tiers.PortRange{{First: 514, Last: 514}}
			read := func() DropSample {
				t.Helper()
				s, err := src.Read(ports)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			if s := read(); s != (DropSample{}) {
				t.Fatalf("first read before any socket = %+v, want none", s)
			}
			for round := range 2 { // the second round is the restarted collector
				var s DropSample
				sent, queued := overflow(t, ns, 514, 300, func() { s = read() })
				if s.Sockets != 1 {
					t.Errorf("round %d: %d sockets, want the collector's 1", round, s.Sockets)
				}
				if want := uint64(sent - queued); s.Drops != want || want == 0 {
					t.Errorf("round %d: drops %d, want sent %d - queued %d = %d (> 0)", round, s.Drops, sent, queued, want)
				}
				t.Logf("round %d: sent %d, queued %d, drops %d", round, sent, queued, s.Drops)
				if s := read(); s != (DropSample{}) {
					t.Errorf("round %d: after the collector closed: %+v, want no socket and no drops", round, s)
				}
			}
			// A socket on another port is not the collector's.
			var other *net.UDPConn
			if err := ns.Do(func() (err error) {
				other, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 515})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if s := read(); s.Sockets != 0 {
				t.Errorf("socket on 515 counted for port 514: %+v", s)
			}
		})
	}
}

// overflow listens on 127.0.0.1:port in ns with the smallest receive
// buffer, sends count datagrams to it without reading, calls probe (while
// the socket is open, as sock_diag needs), then reads what was queued and
// closes the socket.
func overflow(t *testing.T, ns *testenv.NS, port, count int, probe func()) (sent, queued int) {
	t.Helper()
	var rx, tx *net.UDPConn
	err := ns.Do(func() (err error) {
		if rx, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}); err != nil {
			return err
		}
		rc, err := rx.SyscallConn()
		if err != nil {
			return err
		}
		rc.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 2048) })
		if err != nil {
			return err
		}
		tx, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	for i := range count {
		if _, err := tx.WriteToUDPAddrPort(testenv.SyslogMessage(0, i), dst); err != nil {
			t.Fatal(err)
		}
		sent++
	}
	probe()
	buf := make([]byte, 2048)
	for {
		rx.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, _, err := rx.ReadFromUDP(buf); err != nil {
			break
		}
		queued++
	}
	rx.Close()
	return sent, queued
}
