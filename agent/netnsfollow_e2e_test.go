package agent_test

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// overflow binds a collector socket with a small buffer on 127.0.0.1:514
// in ns and sends it n datagrams from ns without reading them: the
// buffer overflows and the socket counts drops.
func overflow(t *testing.T, ns *testenv.NS, conn **net.UDPConn, n int) {
	t.Helper()
	addr := netip.MustParseAddrPort("127.0.0.1:514")
	if *conn == nil {
		c, _, err := sandbox.ListenUDP(ns, addr, 4096)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		*conn = c
	}
	if err := ns.Do(func() error {
		s, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return err
		}
		defer s.Close()
		for i := range n {
			s.Write(testenv.SyslogMessage(1, i))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestDropSourceFollowsRecreatedNS (issue 35 B48): an auto.netns path
// such as /run/netns/NAME names the namespace of the moment: when the
// collector's namespace is deleted and made again under the same name,
// the signal reads the new one (its socket and its drops), not the dead
// one.
func TestDropSourceFollowsRecreatedNS(t *testing.T) {
	testenv.Require(t)
	ns := testenv.NewNS(t)
	ctx := context.Background()
	if out, err := ns.Command(ctx, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ports := []tiers.PortRange{{First: 514, Last: 514}}
	var c1 *net.UDPConn
	overflow(t, ns, &c1, 0)
	src, err := automax.OpenDropSourceIn(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if s, err := src.Read(ports); err != nil || s.Sockets != 1 {
		t.Fatalf("first namespace: %+v, %v; want its collector socket", s, err)
	}
	// The container is recreated: a new namespace under the same name.
	c1.Close()
	if out, err := testenvCmd(ctx, "ip", "netns", "del", ns.Name); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := testenvCmd(ctx, "ip", "netns", "add", ns.Name); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := ns.Command(ctx, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var c2 *net.UDPConn
	overflow(t, ns, &c2, 0)
	if s, err := src.Read(ports); err != nil || s.Sockets != 1 {
		t.Fatalf("after the namespace was made again: %+v, %v; want the new collector socket", s, err)
	}
	overflow(t, ns, &c2, 500)
	if s, err := src.Read(ports); err != nil || s.Sockets != 1 || s.Drops == 0 {
		t.Fatalf("drops in the new namespace: %+v, %v; want some", s, err)
	}
}

func testenvCmd(ctx context.Context, name string, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}
