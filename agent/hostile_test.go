package agent_test

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// issuePolicy is the setup of issue 10: max 1000, tiers 50% → 0% and
// 100% → 100%, udp/514 and tcp/6514 (syn); one window for the whole test,
// under the ordinal shape whose exact counts the tests check.
func issuePolicy(t *testing.T) tiers.Policy {
	t.Helper()
	p, err := tiers.ParseYAML([]byte(`window: 1h
shape: ordinal
max: 1000
tiers: [{at: 50%, drop: 0%}, {at: 100%, drop: 100%}]
select:
  - {proto: udp, ports: [514]}
  - {proto: tcp, ports: [6514], count: syn}
`))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sendSegmented sends count writes of size bytes to dst from a UDP socket
// with UDP_SEGMENT = segment: each write leaves as one GSO super-packet of
// size/segment datagrams where the device takes it whole (a veth does).
func sendSegmented(dst netip.AddrPort, segment, count, size int) (int, error) {
	buf := []byte(strings.Repeat("<134>1 - tierlimit gso test ", size/28+1))[:size]
	return writeSegmented(dst, segment, count, buf)
}

// writeSegmented writes buf count times to dst from a UDP socket with
// UDP_SEGMENT = segment, and returns how many writes went out.
func writeSegmented(dst netip.AddrPort, segment, count int, buf []byte) (int, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT, segment)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	for i := range count {
		if _, err := c.Write(buf); err != nil {
			return i, err
		}
	}
	return count, nil
}

// TestUDPSuperPacketsGeneric is issue 10 §6: in generic mode, 150 writes
// of 1000 bytes with UDP_SEGMENT 100 are 1500 datagrams. They must count
// as 1500 (not 150 skbs), and shedding must start at max: the socket gets
// at most the 1000 - 1 datagrams below the 100% tier, not all 1500.
func TestUDPSuperPacketsGeneric(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	a := startAgent(t, p, attach.XDPGeneric, issuePolicy(t))
	if att := testenv.XDP(t, p.Coll, p.CollIf); att.Mode != "generic" {
		t.Fatalf("limiter runs in %q mode on %s, want generic", att.Mode, p.CollIf)
	}
	dst := netip.AddrPortFrom(p.CollAddr, 514)
	rx := testenv.NewReceiver(t, p.Coll, dst)
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2") // resolve the neighbour first

	before := gather(t, a)
	var sent int
	err := p.Send.Do(func() (err error) {
		sent, err = sendSegmented(dst, 100, 150, 1000)
		return err
	})
	if err != nil || sent != 150 {
		t.Fatalf("sent %d of 150 super-packets: %v", sent, err)
	}
	rx.WaitQuiet(500*time.Millisecond, 10*time.Second)
	_, got := rx.Counts()
	after := gather(t, a)
	d := func(match ...string) float64 {
		return after.sum("tierlimit_selected_packets_total", match...) - before.sum("tierlimit_selected_packets_total", match...)
	}
	counted, dropped := d(), d(`verdict="drop"`)
	t.Logf("1500 datagrams in 150 super-packets: counted %.0f (dropped %.0f), socket received %d, window n %.0f",
		counted, dropped, got, after["tierlimit_window_packets"])
	if counted != 1500 || after["tierlimit_window_packets"] != 1500 {
		t.Errorf("counted %.0f datagrams, window n %.0f; want 1500 and 1500", counted, after["tierlimit_window_packets"])
	}
	// A super-packet passes or drops whole: the ones whose last datagram
	// is below n = 1000 pass (990 datagrams); 999 if the sender's stack
	// segmented them first.
	if got < 990 || got > 999 {
		t.Errorf("socket received %d datagrams, want 990..999 (max 1000, the rest shed)", got)
	}
}

// TestStackedRefused is issue 10 §7: interfaces stacked on each other (a
// macvlan on its parent, a bridge over its port, and a chain of them) are
// refused with an error that names both, and nothing is attached. A
// veth's own peer is not stacked on it.
func TestStackedRefused(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	id := sandbox.RandHex(2)
	mv, br, portA, portB, mvOnBr := "hzmv"+id, "hzbr"+id, "hzpa"+id, "hzpb"+id, "hzmb"+id
	err := p.Coll.Do(func() error {
		macvlanOn := func(name, parent string) error {
			l, err := netlink.LinkByName(parent)
			if err != nil {
				return err
			}
			return netlink.LinkAdd(&netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: l.Attrs().Index}, Mode: netlink.MACVLAN_MODE_BRIDGE})
		}
		if err := macvlanOn(mv, p.CollIf); err != nil {
			return err
		}
		bridge := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: br}}
		if err := netlink.LinkAdd(bridge); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: portA}, PeerName: portB}); err != nil {
			return err
		}
		port, err := netlink.LinkByName(portA)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(port, bridge); err != nil {
			return err
		}
		return macvlanOn(mvOnBr, br)
	})
	if err != nil {
		t.Fatalf("make stacked devices: %v", err)
	}
	for _, c := range []struct {
		ifaces []string
		want   string
	}{
		{[]string{p.CollIf, mv}, mv + " is a macvlan on " + p.CollIf},
		{[]string{mv, p.CollIf}, mv + " is a macvlan on " + p.CollIf},
		{[]string{portA, br}, br + " is the bridge master of " + portA},
		{[]string{mvOnBr, portA}, mvOnBr + " is a macvlan on " + br + ", " + br + " is the bridge master of " + portA},
	} {
		_, err := newAgent(p, agent.Config{Interfaces: c.ifaces, XDPMode: attach.XDPGeneric}, issuePolicy(t))
		if !errors.Is(err, attach.ErrStacked) || !strings.Contains(fmtErr(err), c.want) || !strings.Contains(fmtErr(err), "counted twice") {
			t.Errorf("--iface %v: %v; want ErrStacked saying %q", c.ifaces, err, c.want)
		}
		for _, iface := range c.ifaces {
			if att := testenv.XDP(t, p.Coll, iface); att.ID != 0 {
				t.Errorf("--iface %v refused, but %s runs program %d", c.ifaces, iface, att.ID)
			}
		}
	}
	// The two ends of a veth pair are not stacked: a packet crosses the
	// ingress hook of one end only.
	a, err := newAgent(p, agent.Config{Interfaces: []string{portA, portB}, XDPMode: attach.XDPGeneric}, issuePolicy(t))
	if err != nil {
		t.Fatalf("--iface %s --iface %s (a veth pair): %v", portA, portB, err)
	}
	if err := a.Close(); err != nil {
		t.Error(err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
