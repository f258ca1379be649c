package bpf_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestTCPSuperPackets is issue 33 item 5: under count: packets, a TCP
// super-packet (TSO across a veth, which hands the peer the GSO skb) is
// counted as the segments it carries, in generic mode, as a UDP one is.
// 4 MiB through one connection arrive in far fewer skbs than segments:
// the program must count at least one per MSS of payload.
func TestTCPSuperPackets(t *testing.T) {
	testenv.Require(t)
	t.Run("tso", func(t *testing.T) { tcpSuperPackets(t, 0, false) })
	// BIG TCP (Linux 6.3 and later for IPv4): super-packets of up to
	// 185000 bytes, whose IPv4 total length is 0 (iph_totlen).
	t.Run("big tcp ipv4", func(t *testing.T) { tcpSuperPackets(t, 185000, false) })
	t.Run("big tcp ipv6", func(t *testing.T) { tcpSuperPackets(t, 185000, true) })
}

// tcpSuperPackets runs TestTCPSuperPackets with the sender's IPv4 GSO
// limit set to big when not 0.
func tcpSuperPackets(t *testing.T, big int, v6 bool) {
	p := testenv.NewPair(t)
	if big > 0 {
		if err := p.Send.Do(func() error {
			lk, err := netlink.LinkByName(p.SendIf)
			if err != nil {
				return err
			}
			if v6 {
				return netlink.LinkSetGSOMaxSize(lk, big)
			}
			return netlink.LinkSetGSOIPv4MaxSize(lk, big)
		}); err != nil {
			t.Skipf("no BIG TCP for IPv4 here: %v", err)
		}
	}
	var collIdx int
	if err := p.Coll.Do(func() error {
		lk, err := netlink.LinkByName(p.CollIf)
		collIdx = lk.Attrs().Index
		return err
	}); err != nil {
		t.Fatal(err)
	}
	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pol := ordinalDefault()
	pol.Window, pol.Max = time.Hour, 100_000_000
	pol.Select = []tiers.Rule{{Proto: tiers.ProtoTCP, Ports: []tiers.PortRange{{First: 601, Last: 601}}, Count: tiers.CountPackets}}
	tab, err := tiers.Compile(pol, l.Tick())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(context.Background(), tab); err != nil {
		t.Fatal(err)
	}
	if err := p.Coll.Do(func() error {
		lk, err := link.AttachXDP(link.XDPOptions{Program: l.Program(), Interface: collIdx, Flags: link.XDPGenericMode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { lk.Close() })
		return l.SetSKBIfaces([]int{collIdx})
	}); err != nil {
		t.Fatal(err)
	}
	coll := p.CollAddr
	if v6 {
		coll = p.CollAddr6
	}
	var ln net.Listener
	if err := p.Coll.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(coll.String(), "601"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	const size = 4 << 20
	s0, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Send.Do(func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", net.JoinHostPort(coll.String(), "601"))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		_, err = c.Write(make([]byte, size))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := <-got; n != size {
		t.Fatalf("received %d bytes, want %d", n, size)
	}
	s1, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	counted := s1.SelectedPackets() - s0.SelectedPackets()
	var mal uint64
	for i := range s1.Malformed {
		mal += s1.Malformed[i].Packets - s0.Malformed[i].Packets
	}
	const mss = 1460 // the most payload a segment carries at MTU 1500
	t.Logf("%d bytes in one connection: %d segments counted (at least %d), %d frames malformed", size, counted, size/mss, mal)
	if mal != 0 {
		t.Errorf("%d super-packets read as malformed", mal)
	}
	if counted < size/mss {
		t.Errorf("counted %d segments for %d bytes: fewer than one per MSS (%d), super-packets counted once", counted, size, size/mss)
	}
}
