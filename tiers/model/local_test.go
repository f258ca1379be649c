package model

import (
	"net/netip"
	"testing"

	"github.com/tierlimit/tierlimit/tiers"
)

// TestWithLocal: a parsed rule without dests is Local; unresolved it
// counts any destination (the program's own tests), resolved it counts the
// host's destinations only, besides its explicit dests; the original
// policy is left as it was, and too many local destinations are refused.
func TestWithLocal(t *testing.T) {
	p, err := tiers.ParseYAML([]byte("select:\n  - {proto: udp, ports: [514]}\n  - {proto: udp, ports: [515], dests: [local, 10.0.0.0/8]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Select[0].Local || !p.Select[1].Local {
		t.Fatalf("rules %+v: want both Local", p.Select)
	}
	host, other, ten := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("10.1.1.1")
	if !selects(p, tiers.ProtoUDP, 514, other, false) {
		t.Error("unresolved dests: local does not count any destination")
	}
	r := p.WithLocal(tiers.UnicastDests(netip.PrefixFrom(host, 32)))
	for _, c := range []struct {
		port uint16
		dst  netip.Addr
		want bool
	}{{514, host, true}, {514, other, false}, {514, ten, false}, {515, host, true}, {515, ten, true}, {515, other, false}} {
		if got := selects(r, tiers.ProtoUDP, c.port, c.dst, false); got != c.want {
			t.Errorf("resolved: udp/%d to %v selected %v, want %v", c.port, c.dst, got, c.want)
		}
	}
	if len(p.Select[0].LocalDests) != 0 {
		t.Errorf("WithLocal changed its policy: %+v", p.Select[0])
	}
	if _, err := tiers.Compile(r, 0); err != nil {
		t.Errorf("compile resolved: %v", err)
	}
	// One entry per destination, however many rules name it: the budget
	// is the host's destinations, not rules × destinations (issue 35 B46).
	many := make([]netip.Prefix, tiers.LocalBudget(p)+1)
	for i := range many {
		many[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
	}
	if err := p.WithLocal(tiers.UnicastDests(many[:len(many)-1]...)).Validate(); err != nil {
		t.Errorf("%d local destinations in 2 rules: Validate refuses them (%v), want them taken once each", len(many)-1, err)
	}
	if err := p.WithLocal(tiers.UnicastDests(many...)).Validate(); err == nil {
		t.Errorf("%d local destinations in 2 rules: Validate accepts them, at most %d", len(many), tiers.LocalBudget(p))
	}
}

// TestWithLocalTCPUnicast: a TCP rule's local destinations are the unicast
// ones only; a UDP rule's are all of them, broadcast and multicast too
// (Linux delivers UDP to those, and answers TCP on none: LocalDest).
func TestWithLocalTCPUnicast(t *testing.T) {
	p, err := tiers.ParseYAML([]byte("select:\n  - {proto: udp, ports: [514]}\n  - {proto: tcp, ports: [601], count: syn}\n"))
	if err != nil {
		t.Fatal(err)
	}
	host, bcast, mcast := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.255"), netip.MustParseAddr("224.0.0.1")
	any6 := netip.MustParseAddr("2001:db8::")
	r := p.WithLocal([]tiers.LocalDest{
		{Prefix: netip.PrefixFrom(host, 32), Unicast: true},
		{Prefix: netip.PrefixFrom(bcast, 32)},
		{Prefix: netip.MustParsePrefix("224.0.0.0/4")},
		{Prefix: netip.PrefixFrom(any6, 128)},
	})
	for _, c := range []struct {
		proto tiers.Proto
		port  uint16
		dst   netip.Addr
		want  bool
	}{
		{tiers.ProtoUDP, 514, host, true}, {tiers.ProtoUDP, 514, bcast, true}, {tiers.ProtoUDP, 514, mcast, true}, {tiers.ProtoUDP, 514, any6, true},
		{tiers.ProtoTCP, 601, host, true}, {tiers.ProtoTCP, 601, bcast, false}, {tiers.ProtoTCP, 601, mcast, false}, {tiers.ProtoTCP, 601, any6, false},
	} {
		if got := selects(r, c.proto, c.port, c.dst, true); got != c.want {
			t.Errorf("%v/%d to %v selected %v, want %v", c.proto, c.port, c.dst, got, c.want)
		}
	}
	if got := len(r.Select[1].LocalDests); got != 1 {
		t.Errorf("tcp rule's local dests %v: want the one unicast address", r.Select[1].LocalDests)
	}
}
