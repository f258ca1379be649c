package bpf_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// destEntries counts the entries of select_dests, over both slots.
func destEntries(t *testing.T, h *harness) int {
	t.Helper()
	var (
		k bpf.LimiterTlLpmKey
		v uint32
		n int
	)
	it := h.l.MapNamed("select_dests").Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDestsOncePerDestination (issue 35 B46): under the default policy,
// whose UDP rule and TCP rule both name each of the host's unicast
// addresses, 5,000 addresses and 11 broadcast and multicast routes take
// 5,011 entries of the destination trie, not 10,011 (one per rule and
// destination); the 5,000th address is still counted by both rules, and
// the broadcast by the UDP rule only, as the model says.
func TestDestsOncePerDestination(t *testing.T) {
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, 100_000_000
	var local []tiers.LocalDest
	for i := range 5000 {
		a := netip.AddrFrom4([4]byte{10, 77, byte(i >> 8), byte(i)})
		local = append(local, tiers.LocalDest{Prefix: netip.PrefixFrom(a, 32), Unicast: true})
	}
	for i := range 10 {
		local = append(local, tiers.LocalDest{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 78, byte(i), 255}), 32)})
	}
	local = append(local, tiers.LocalDest{Prefix: netip.MustParsePrefix("224.0.0.0/4")})
	r := p.WithLocal(local)
	if n, per := tiers.DestEntries(r), len(r.Select[0].LocalDests)+len(r.Select[1].LocalDests); n != 5011 || per != 10011 {
		t.Errorf("DestEntries %d (rules name %d), want 5011 (10011)", n, per)
	}
	h := newHarness(t, r)
	if n := destEntries(t, h); n != 5011 {
		t.Errorf("select_dests holds %d entries, want 5011", n)
	}
	last, bcast := net.IPv4(10, 77, 19, 135).To4(), net.IPv4(10, 78, 9, 255).To4() // 4999 = 19 << 8 | 135
	for _, c := range []struct {
		name  string
		frame []byte
		want  model.Class
	}{
		{"udp/514 to the 5,000th address", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, last, layers.IPProtocolUDP), UDP(514), Syslog()), model.ClassSelected},
		{"tcp/6514 SYN to the 5,000th address", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, last, layers.IPProtocolTCP), TCP(6514, true, false)), model.ClassSelected},
		{"udp/514 to a broadcast", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, bcast, layers.IPProtocolUDP), UDP(514), Syslog()), model.ClassSelected},
		{"tcp/601 SYN to a broadcast", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, bcast, layers.IPProtocolTCP), TCP(601, true, false)), model.ClassUnselected},
	} {
		checkClass(t, h, c.name, c.frame, c.want)
	}
	// Reloaded without the broadcasts, the other slot; then back: the
	// entries follow, each slot's once.
	h.apply(p.WithLocal(local[:5000]))
	if n := destEntries(t, h); n != 5011+5000 {
		t.Errorf("both slots: select_dests holds %d entries, want 10011", n)
	}
	checkClass(t, h, "udp/514 to a broadcast, reloaded away", Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, bcast, layers.IPProtocolUDP), UDP(514), Syslog()), model.ClassUnselected)
}

// TestDestsNested: one trie entry per prefix answers for every rule,
// though the rules name prefixes that nest: an address under a rule's /32
// is also under the /16 and the /8 of the others, and the longest match
// must answer for all three; the model (per rule) agrees on each.
func TestDestsNested(t *testing.T) {
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, 100_000_000
	rule := func(port uint16, dests ...string) tiers.Rule {
		r := tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: port, Last: port}}}
		for _, d := range dests {
			r.Dests = append(r.Dests, netip.MustParsePrefix(d))
		}
		return r
	}
	p.Select = []tiers.Rule{
		rule(1001, "10.0.0.0/8", "2001:db8::/32"),
		rule(1002, "10.1.0.0/16", "2001:db8:1::/48"),
		rule(1003, "10.1.2.3/32", "10.0.0.0/8", "2001:db8:1::3/128"),
		rule(1004, "10.1.2.0/24", "::/0"),
	}
	h := newHarness(t, p)
	if n, want := destEntries(t, h), 8; n != want {
		t.Errorf("select_dests holds %d entries, want %d (10.0.0.0/8 once)", n, want)
	}
	for _, dst := range []string{"10.1.2.3", "10.1.2.4", "10.1.3.3", "10.2.0.1", "11.0.0.1", "2001:db8:1::3", "2001:db8:1::4", "2001:db8:2::1", "2001:db9::1"} {
		a := netip.MustParseAddr(dst)
		for port := uint16(1001); port <= 1004; port++ {
			var frame []byte
			if a.Is4() {
				frame = Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, a.AsSlice(), layers.IPProtocolUDP), UDP(port), Syslog())
			} else {
				frame = Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, a.AsSlice(), layers.IPProtocolUDP), UDP(port), Syslog())
			}
			checkClass(t, h, fmt.Sprintf("udp/%d to %s", port, dst), frame, model.Classify(h.p, frame).Class)
		}
	}
	// The model itself, on the cases the nesting decides.
	for _, c := range []struct {
		dst  string
		port uint16
		want model.Class
	}{{"10.1.2.3", 1001, model.ClassSelected}, {"10.1.2.3", 1002, model.ClassSelected}, {"10.1.3.3", 1004, model.ClassUnselected}, {"10.2.0.1", 1002, model.ClassUnselected}, {"10.2.0.1", 1003, model.ClassSelected}} {
		frame := Serialize(t, Eth(layers.EthernetTypeIPv4), IPv4(Src4, netip.MustParseAddr(c.dst).AsSlice(), layers.IPProtocolUDP), UDP(c.port), Syslog())
		if got := model.Classify(h.p, frame).Class; got != c.want {
			t.Errorf("model: udp/%d to %s %v, want %v", c.port, c.dst, got, c.want)
		}
	}
}

// checkClass runs frame 3 times and checks that the program counts it
// as want says.
func checkClass(t *testing.T, h *harness, name string, frame []byte, want model.Class) {
	t.Helper()
	s0 := h.stats()
	for range 3 {
		h.run(frame)
	}
	s1 := h.stats()
	sel, unsel := s1.SelectedPackets()-s0.SelectedPackets(), s1.Unselected.Packets-s0.Unselected.Packets
	if w := want == model.ClassSelected; (sel == 3) != w || (unsel == 3) == w {
		t.Errorf("%s: %d of 3 counted, %d unselected; want counted %v", name, sel, unsel, w)
	}
	if got := model.Classify(h.p, frame).Class; got != want {
		t.Errorf("%s: model says %v, want %v", name, got, want)
	}
}

// BenchmarkDestsBeside measures the selected paths through dests: local
// in today's program beside another build of it, the object at
// $TIERLIMIT_BASE_OBJ (main's limiter_bpfel.o before destinations were
// held once; skipped without it), loaded by today's loader with the same
// policy, best chunk of each in the same run: x-base is today's ns/pkt
// over the base's.
//   - local-udp: udp/514 to the host under a dozen local destinations
//     (BenchmarkProgram selected-pass-local);
//   - local-5000-syn: a SYN to tcp/601 under 5,000 host addresses.
func BenchmarkDestsBeside(b *testing.B) {
	base := os.Getenv("TIERLIMIT_BASE_OBJ")
	if base == "" {
		b.Skip("TIERLIMIT_BASE_OBJ unset: no object to compare with")
	}
	policy := func() tiers.Policy {
		p := ordinalDefault()
		p.Window, p.Max = time.Hour, 100_000_000
		p.Record = tiers.Record{}
		return p
	}
	many := func(p tiers.Policy) tiers.Policy {
		local := []tiers.LocalDest{{Prefix: netip.MustParsePrefix("198.51.100.1/32"), Unicast: true}}
		for i := range 5000 {
			local = append(local, tiers.LocalDest{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, byte(i >> 8), byte(i)}), 32), Unicast: true})
		}
		return p.WithLocal(local)
	}
	for _, path := range []struct {
		name  string
		p     tiers.Policy
		frame []byte
	}{
		{"local-udp", localDests(policy()), UDP4(b, 514)},
		{"local-5000-syn", many(policy()), TCP4(b, 601, true, false)},
	} {
		b.Run(path.name, func(b *testing.B) {
			h := newHarness(b, path.p)
			old := objectHarness(b, path.p, base)
			h.expire()
			old.expire()
			bare := BareProgram(b, xdpDrop)
			for _, x := range []*harness{h, old} {
				s0 := x.stats()
				if _, err := runExact(x.l.Program(), path.frame, 200); err != nil {
					b.Fatal(err)
				}
				s1 := x.stats()
				if got := s1.SelectedPackets() - s0.SelectedPackets(); got != 200 {
					b.Fatalf("%d of 200 selected", got)
				}
			}
			best := bestRotated(b, path.frame, h.l.Program(), old.l.Program(), bare)
			b.ReportMetric(best[0], "ns/pkt")
			b.ReportMetric(best[1], "base-ns/pkt")
			b.ReportMetric(best[2], "bare-ns/pkt")
			b.ReportMetric(best[0]/best[1], "x-base")
			b.ReportMetric(0, "ns/op")
		})
	}
}
