package bpf_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// TestDestCacheAcrossReloads: a destination the trie held is not counted
// once a reload has taken it out, though each CPU's dest_cache answered
// for it, and the slot it was cached for is written again two reloads on.
func TestDestCacheAcrossReloads(t *testing.T) {
	with := ordinalDefault().WithLocal(tiers.UnicastDests(netip.MustParsePrefix("198.51.100.1/32")))
	without := ordinalDefault().WithLocal(tiers.UnicastDests(netip.MustParsePrefix("198.51.100.2/32")))
	h := newHarness(t, with)
	frame := UDP4(t, 514) // to 198.51.100.1
	count := func(what string, want uint64) {
		t.Helper()
		s0 := h.stats()
		for range 3 { // on the CPU the test runs on, twice from the cache
			h.run(frame)
		}
		s1 := h.stats()
		if got := s1.SelectedPackets() - s0.SelectedPackets(); got != want {
			t.Errorf("%s: %d of 3 counted, want %d", what, got, want)
		}
	}
	count("destination in the policy", 3)
	h.apply(with) // the other slot
	count("the same policy in the other slot", 3)
	h.apply(without) // the first slot again, without the destination
	count("destination reloaded away", 0)
	h.apply(with)
	h.apply(with)
	count("destination back", 3)
	if c := model.Classify(h.p, frame); c.Class != model.ClassSelected {
		t.Errorf("classifier: %v", c.Class)
	}
}

// TestLocalTCPUnicast: resolved as the agent resolves it, dests: local
// counts UDP to the host's broadcast and multicast destinations, which
// Linux delivers, but TCP only to its unicast ones: a SYN flood to the
// subnet broadcast or a multicast group, which Linux answers on no socket
// (tiers.LocalDest), passes uncounted, as the model says.
func TestLocalTCPUnicast(t *testing.T) {
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, 100_000_000
	h := newHarness(t, localDests(p))
	bcast, mcast := net.IPv4(198, 51, 100, 255).To4(), net.IPv4(224, 0, 0, 1).To4()
	for _, c := range []struct {
		name  string
		frame []byte
		want  model.Class
	}{
		{"udp/514 to the host", UDP4(t, 514), model.ClassSelected},
		{"udp/514 to the subnet broadcast", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, bcast, layers.IPProtocolUDP), UDP(514), Syslog()), model.ClassSelected},
		{"udp/514 to a multicast group", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, mcast, layers.IPProtocolUDP), UDP(514), Syslog()), model.ClassSelected},
		{"tcp/601 SYN to the host", TCP4(t, 601, true, false), model.ClassSelected},
		{"tcp/601 SYN to the subnet broadcast", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, bcast, layers.IPProtocolTCP), TCP(601, true, false)), model.ClassUnselected},
		{"tcp/601 SYN to a multicast group", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, mcast, layers.IPProtocolTCP), TCP(601, true, false)), model.ClassUnselected},
	} {
		s0 := h.stats()
		for range 3 {
			h.run(c.frame)
		}
		s1 := h.stats()
		sel, unsel := s1.SelectedPackets()-s0.SelectedPackets(), s1.Unselected.Packets-s0.Unselected.Packets
		if want := c.want == model.ClassSelected; (sel == 3) != want || (unsel == 3) == want {
			t.Errorf("%s: %d of 3 counted, %d unselected; want counted %v", c.name, sel, unsel, want)
		}
		if got := model.Classify(h.p, c.frame).Class; got != c.want {
			t.Errorf("%s: model says %v, want %v", c.name, got, c.want)
		}
	}
}
