package bpf_test

import (
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// TestSeverityIPv6UDPLengthZero is issue 43: an IPv6 UDP datagram whose
// UDP length is 0 is the rest of the IPv6 payload (__udp6_lib_rcv), and
// its <PRI> is read from that payload, not from an empty one: a protected
// severity keeps its protection. Each row runs through the program
// (BPF_PROG_TEST_RUN) and the Go reader (model.UDPPayload, then
// tiers.SyslogSeverity), which must both give the class wanted.
func TestSeverityIPv6UDPLengthZero(t *testing.T) {
	p := severityPolicy(t, 1_000_000)
	h := newHarness(t, p)
	eth6 := func() *layers.Ethernet { return Eth(layers.EthernetTypeIPv6) }
	ip6 := func(next layers.IPProtocol) *layers.IPv6 { return IPv6(Src6, Dst6, next) }
	udp6 := func(pl string) []byte {
		return Serialize(t, eth6(), ip6(layers.IPProtocolUDP), UDP(514), gopacket.Payload(pl))
	}
	hbh := func(pl string) []byte {
		return Serialize(t, eth6(), ip6(layers.IPProtocolIPv6HopByHop), hopByHop(layers.IPProtocolUDP), UDP(514), gopacket.Payload(pl))
	}
	zero := func(f []byte, l4 int) []byte { return with16(f, l4+udpLen, 0) }
	for _, c := range []struct {
		name  string
		frame []byte
		want  tiers.SeverityClass
	}{
		{"<10> crit, UDP length 0", zero(udp6("<10>1 - - - - - x"), l4Off6), tiers.SevProtected},
		{"<15> debug, UDP length 0", zero(udp6("<15>x"), l4Off6), tiers.SevShedFirst},
		{"<7> debug, UDP length 0, exactly the <PRI>", zero(udp6("<7>"), l4Off6), tiers.SevShedFirst},
		{"<14> info, UDP length 0", zero(udp6("<14>x"), l4Off6), tiers.SevNormal},
		// The IPv6 payload length bounds the payload: the trailer is not
		// the datagram's.
		{"<1 then 0> in the trailer, UDP length 0", append(zero(udp6("<1"), l4Off6), "0>x"...), tiers.SevNormal},
		{"<10> behind a hop-by-hop header, UDP length 0", zero(hbh("<10>x"), l4Off6+8), tiers.SevProtected},
		// The jumbogram path (payload length 0, hop-by-hop first): the
		// rest of the frame.
		{"<10>, payload length 0 and UDP length 0", with16(zero(hbh("<10>x"), l4Off6+8), ipv6Pay, 0), tiers.SevProtected},
		// A UDP length of 8 is an empty payload still.
		{"<10> past a UDP length of 8", with16(udp6("<10>x"), l4Off6+udpLen, 8), tiers.SevNormal},
	} {
		sev, ok := tiers.SyslogSeverity(model.UDPPayload(c.frame))
		if !ok {
			sev = -1
		}
		if got := p.Severity.ClassOf(sev); got != c.want {
			t.Errorf("%s: the model reads payload %q: class %v, want %v", c.name, model.UDPPayload(c.frame), got, c.want)
		}
		before := h.stats()
		h.run(c.frame)
		if got := classMoved(before, h.stats()); got != int(c.want) {
			t.Errorf("%s: the program counted class %d, want %v (%d)", c.name, got, c.want, c.want)
		}
	}
}
