package traffic

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestPaceAndCounter sends 500 tagged datagrams over loopback and counts
// them all; BurstOf reads the tag back.
func TestPaceAndCounter(t *testing.T) {
	recv, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	recv.SetReadBuffer(4 << 20)
	c := NewCounter(recv)
	defer c.Close()
	send, err := net.ListenUDP("udp", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	dst := recv.LocalAddr().(*net.UDPAddr).AddrPort()
	const n = 500
	sent, err := Pace(context.Background(), send, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), dst.Port()), n,
		50*time.Millisecond, 10*time.Second, func(i int) []byte { return SyslogMessage(7, i) })
	if err != nil || sent != n {
		t.Fatalf("sent %d of %d: %v", sent, n, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.Count() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := c.Count(); got != n {
		t.Fatalf("counted %d of %d", got, n)
	}
	if b, ok := BurstOf(SyslogMessage(7, 3)); !ok || b != 7 {
		t.Errorf("BurstOf = %d, %v", b, ok)
	}
	if _, ok := BurstOf([]byte("<134>1 other")); ok {
		t.Error("BurstOf read a burst from an untagged message")
	}
}

// TestPaceStops: a cancelled context stops Pace with its error.
func TestPaceStops(t *testing.T) {
	send, err := net.ListenUDP("udp", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sent, err := Pace(ctx, send, netip.MustParseAddrPort("127.0.0.1:9"), 10, time.Second, time.Second, func(i int) []byte { return SyslogMessage(0, i) })
	if sent != 0 || err != context.Canceled {
		t.Fatalf("sent %d, %v; want 0, context.Canceled", sent, err)
	}
}
