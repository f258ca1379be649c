package bpf_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// severityPolicy is the policy: the seed's tiers with max, protect
// emerg..err within 5% of max, shed debug first.
func severityPolicy(tb testing.TB, max uint64) tiers.Policy {
	tb.Helper()
	p := ordinalDefault()
	p.Max, p.Window = max, time.Hour
	p.Severity = &tiers.Severity{Protect: []int{0, 1, 2, 3}, ProtectBudget: tiers.Pct(5), ShedFirst: []int{7}}
	if err := p.Validate(); err != nil {
		tb.Fatal(err)
	}
	return p
}

func syslog4(tb testing.TB, payload string) []byte {
	return Serialize(tb, Eth(layers.EthernetTypeIPv4), IPv4(Src4, Dst4, layers.IPProtocolUDP), UDP(514), gopacket.Payload(payload))
}

// padded is frame cut at its IPv4 datagram's end, then pad (Ethernet
// padding that the IP and UDP lengths leave out).
func padded(frame []byte, end int, pad string) []byte {
	return append(frame[:end:end], pad...)
}

// classMoved returns the severity class whose counters a packet moved, or
// -1 when it moved none.
func classMoved(before, after bpf.Stats) int {
	for c := range after.Severity {
		if after.Severity[c] != before.Severity[c] {
			return c
		}
	}
	return -1
}

// TestSeverityParse runs the <PRI> forms of RFC 5424 §6.2.1 and the ways
// they can be malformed through the program, and checks the class it
// counts against the Go reader tiers.SyslogSeverity.
func TestSeverityParse(t *testing.T) {
	p := severityPolicy(t, 1_000_000)
	h := newHarness(t, p)
	vlan := &layers.Dot1Q{VLANIdentifier: 7, Type: layers.EthernetTypeIPv4}
	ip4 := func() *layers.IPv4 { return IPv4(Src4, Dst4, layers.IPProtocolUDP) }
	for _, c := range []struct {
		name    string
		frame   []byte
		payload string // what tiers.SyslogSeverity reads
		want    tiers.SeverityClass
	}{
		{"<0> emerg", syslog4(t, "<0>1 - - - - - x"), "<0>1 -", tiers.SevProtected},
		{"<7> debug", syslog4(t, "<7>x"), "<7>x", tiers.SevShedFirst},
		{"<10> user.crit", syslog4(t, "<10>1 2026-11-30T00:00:00Z h a - - - x"), "<10>1", tiers.SevProtected},
		{"<14> user.info", syslog4(t, "<14>x"), "<14>x", tiers.SevNormal},
		{"<15> exactly", syslog4(t, "<15>"), "<15>", tiers.SevShedFirst},
		{"<191> local7.debug", syslog4(t, "<191>x"), "<191>x", tiers.SevShedFirst},
		{"<184> local7.emerg", syslog4(t, "<184>x"), "<184>x", tiers.SevProtected},
		{"<192> out of range", syslog4(t, "<192>x"), "<192>x", tiers.SevNormal},
		{"<999>", syslog4(t, "<999>x"), "<999>x", tiers.SevNormal},
		{"<> empty", syslog4(t, "<>x"), "<>x", tiers.SevNormal},
		{"<1a>", syslog4(t, "<1a>x"), "<1a>x", tiers.SevNormal},
		{"<01> leading zero", syslog4(t, "<01>x"), "<01>x", tiers.SevNormal},
		{"<00> leading zero", syslog4(t, "<00>x"), "<00>x", tiers.SevNormal},
		{"<0010> four digits", syslog4(t, "<0010>x"), "<0010>x", tiers.SevNormal},
		{"<1234> four digits", syslog4(t, "<1234>x"), "<1234>x", tiers.SevNormal},
		{"cut after <1", syslog4(t, "<1"), "<1", tiers.SevNormal},
		{"cut after <15", syslog4(t, "<15"), "<15", tiers.SevNormal},
		{"1-byte payload", syslog4(t, "<"), "<", tiers.SevNormal},
		{"no payload", syslog4(t, ""), "", tiers.SevNormal},
		{"no <", syslog4(t, "15>x"), "15>x", tiers.SevNormal},
		{"IPv6 <10>", Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolUDP), UDP(514), gopacket.Payload("<10>x")), "<10>x", tiers.SevProtected},
		{"VLAN <15>", Serialize(t, Eth(layers.EthernetTypeDot1Q), vlan, ip4(), UDP(514), gopacket.Payload("<15>x")), "<15>x", tiers.SevShedFirst},
		// Ethernet padding past the UDP length is not the datagram's.
		{"<10> in the padding of an empty datagram", padded(syslog4(t, ""), 42, "<10>x"), "", tiers.SevNormal},
		{"<1 then 0> in the padding", padded(syslog4(t, "<1"), 44, "0>x"), "<1", tiers.SevNormal},
		{"first fragment <10>", frag4(t, 77, 0, true, UDP(514), gopacket.Payload("<10>xxxxxxxxxxxxxxxxxxxx")), "<10>x", tiers.SevProtected},
	} {
		if sev, ok := tiers.SyslogSeverity([]byte(c.payload)); p.Severity.ClassOf(map[bool]int{true: sev, false: -1}[ok]) != c.want {
			t.Errorf("%s: tiers.SyslogSeverity(%q) = %d, %v: class %v, want %v", c.name, c.payload, sev, ok,
				p.Severity.ClassOf(map[bool]int{true: sev, false: -1}[ok]), c.want)
		}
		before := h.stats()
		h.run(c.frame)
		if got := classMoved(before, h.stats()); got != int(c.want) {
			t.Errorf("%s: the program counted class %d, want %v (%d)", c.name, got, c.want, c.want)
		}
	}
	// TCP is never classed: severity applies to UDP rules only.
	before := h.stats()
	h.run(TCP4(t, 601, true, false))
	if got := classMoved(before, h.stats()); got != -1 {
		t.Errorf("a TCP SYN moved severity class %d", got)
	}
}

// TestSeverityDeterministic compares every verdict with the model on a
// policy whose tiers are all deterministic (0% and 100%), so protection,
// payment and shed-first are too: the program and the model must agree
// packet by packet, protection included.
func TestSeverityDeterministic(t *testing.T) {
	p := severityPolicy(t, 1000)
	// Tier 1 drops all (protection runs up debt), tier 2 none (others pay
	// it off; shed-first in tier 1 takes tier 2's 0%), tier 3 all.
	p.Tiers = []tiers.Tier{{At: tiers.Pct(50), Drop: tiers.Pct(100)}, {At: tiers.Pct(80), Drop: tiers.Pct(0)}, {At: tiers.Pct(120), Drop: tiers.Pct(100)}}
	h := newHarness(t, p)
	m := model.NewModel(p, h.tab, func() uint32 { t.Fatal("model drew a random number"); return 0 })
	rng := rand.New(rand.NewPCG(3, 4))
	payloads := []string{"<10>crit", "<14>info", "<15>debug", "<3>err", "no pri", "<192>"}
	var now uint64 = 1
	var protections, payments int
	for i := range 5000 {
		if i%1500 == 1499 {
			h.expire()
			now += uint64(p.Window) + 1
		}
		pl := payloads[rng.IntN(len(payloads))]
		sev, ok := tiers.SyslogSeverity([]byte(pl))
		if !ok {
			sev = -1
		}
		now++
		d := m.PacketSeverity(now, sev)
		before := h.stats()
		ret := h.run(syslog4(t, pl))
		after := h.stats()
		wantRet := uint32(xdpPass)
		if d.Verdict == tiers.VerdictDrop {
			wantRet = xdpDrop
		}
		if ret != wantRet || h.window().Count != d.N || h.window().Debt != m.Debt() {
			t.Fatalf("packet %d (%q, n=%d, tier %d, class %v): action %d debt %d, model %v debt %d",
				i, pl, d.N, d.Tier, d.Class, ret, h.window().Debt, d.Verdict, m.Debt())
		}
		if got := classMoved(before, after); got != int(d.Class) {
			t.Fatalf("packet %d: class %d, model %v", i, got, d.Class)
		}
		prot := after.ProtectedPass.Packets - before.ProtectedPass.Packets
		paid := after.PaidDrop.Packets - before.PaidDrop.Packets
		if (prot == 1) != d.Protected || (paid == 1) != d.Paid {
			t.Fatalf("packet %d: protected %d paid %d, model %v %v", i, prot, paid, d.Protected, d.Paid)
		}
		if d.Protected {
			protections++
		}
		if d.Paid {
			payments++
		}
	}
	if protections == 0 || payments == 0 {
		t.Fatalf("%d protections, %d payments: the test exercised too little", protections, payments)
	}
	t.Logf("5000 packets, %d protections and %d payments, all as the model", protections, payments)
}

// TestSeverityDifferential runs a random sequence of PRIs with the seed's
// random tiers through the program and the model: n, tier and class agree
// exactly, and the program's drops are within 5σ of the model's mean over
// many runs of the same sequence.
func TestSeverityDifferential(t *testing.T) {
	p := severityPolicy(t, 1000)
	h := newHarness(t, p)
	rng := rand.New(rand.NewPCG(5, 6))
	payloads := []string{"<10>crit", "<14>info", "<15>debug", "no pri"}
	const windows, perWindow = 4, 3000
	seq := make([]string, windows*perWindow)
	for i := range seq {
		seq[i] = payloads[rng.IntN(len(payloads))]
	}
	sevOf := func(pl string) int {
		if s, ok := tiers.SyslogSeverity([]byte(pl)); ok {
			return s
		}
		return -1
	}
	// The model's distribution of total drops on this sequence.
	const runs = 200
	var sum, sumSq float64
	var first []model.Decision
	for r := range runs {
		m := model.NewModel(p, h.tab, rand.New(rand.NewPCG(uint64(r), 7)).Uint32)
		drops := 0
		var now uint64
		for i, pl := range seq {
			if i%perWindow == 0 {
				now += uint64(p.Window) + 1
			}
			now++
			d := m.PacketSeverity(now, sevOf(pl))
			if d.Verdict == tiers.VerdictDrop {
				drops++
			}
			if r == 0 {
				first = append(first, d)
			}
		}
		sum += float64(drops)
		sumSq += float64(drops) * float64(drops)
	}
	mean := sum / runs
	sd := math.Sqrt(sumSq/runs - mean*mean)

	progDrops := 0
	for i, pl := range seq {
		if i%perWindow == 0 {
			h.expire()
		}
		before := h.stats()
		if h.run(syslog4(t, pl)) == xdpDrop {
			progDrops++
		}
		after := h.stats()
		d := first[i]
		if n := h.window().Count; n != d.N {
			t.Fatalf("packet %d: n %d, model %d", i, n, d.N)
		}
		if got := classMoved(before, after); got != int(d.Class) {
			t.Fatalf("packet %d: class %d, model %v", i, got, d.Class)
		}
	}
	bound := 5 * sd
	t.Logf("%d packets: program dropped %d; model %.1f ± %.1f (5σ over %d runs)", len(seq), progDrops, mean, bound, runs)
	if math.Abs(float64(progDrops)-mean) > bound {
		t.Fatalf("program dropped %d, model %.1f ± %.1f", progDrops, mean, bound)
	}
}

// TestSeverityForgedFlood: a flood that forges a protected severity gets at
// most protect_budget packets per window more than the tiers give it. Per
// window the protected passes that stay unpaid never exceed the budget, and
// the passed count stays within 5σ of tiers.Expected plus the budget.
func TestSeverityForgedFlood(t *testing.T) {
	const max, offered = 1000, 5000
	p := severityPolicy(t, max)
	h := newHarness(t, p)
	budget := h.tab.Severity.ProtectBudget
	exp := h.tab.Expected(offered)
	frame := syslog4(t, "<10>1 - forged crit")
	for w := range 3 {
		h.expire()
		before := h.stats()
		passed := 0
		for range offered {
			if h.run(frame) == xdpPass {
				passed++
			}
		}
		after := h.stats()
		extra := int64(after.ProtectedPass.Packets-before.ProtectedPass.Packets) - int64(after.PaidDrop.Packets-before.PaidDrop.Packets)
		bound := exp.Passed + float64(budget) + 5*math.Sqrt(exp.Variance)
		t.Logf("window %d: passed %d (tiers expect %.1f, budget %d), protection kept %d", w, passed, exp.Passed, budget, extra)
		if extra < 0 || uint64(extra) > budget {
			t.Errorf("window %d: protection passed %d unpaid, budget %d", w, extra, budget)
		}
		if float64(passed) > bound {
			t.Errorf("window %d: passed %d, more than %.1f", w, passed, bound)
		}
	}
}

// TestSeverityDryRun: dry-run shows what protection would do, and every
// packet still passes.
func TestSeverityDryRun(t *testing.T) {
	p := severityPolicy(t, 100)
	p.Mode = tiers.ModeDryRun
	h := newHarness(t, p)
	h.preload(1000) // the last tier: every verdict would be a drop
	before := h.stats()
	for i := range 10 {
		if ret := h.run(syslog4(t, fmt.Sprintf("<%d>x", []int{10, 15}[i%2]))); ret != xdpPass {
			t.Fatalf("dry-run dropped a packet (action %d)", ret)
		}
	}
	after := h.stats()
	prot := after.Severity[tiers.SevProtected][tiers.VerdictPass].Packets - before.Severity[tiers.SevProtected][tiers.VerdictPass].Packets
	shed := after.Severity[tiers.SevShedFirst][tiers.VerdictWouldDrop].Packets - before.Severity[tiers.SevShedFirst][tiers.VerdictWouldDrop].Packets
	if prot != 5 || shed != 5 || after.ProtectedPass.Packets-before.ProtectedPass.Packets != 5 {
		t.Fatalf("dry-run: protected passed %d, shed-first would_drop %d, protections %d; want 5, 5, 5",
			prot, shed, after.ProtectedPass.Packets-before.ProtectedPass.Packets)
	}
}

// TestSeverityReload: a reload changes the classes with the rest of the
// policy, and one without a severity block stops reading the <PRI>; the
// window and its debt carry on.
func TestSeverityReload(t *testing.T) {
	p := severityPolicy(t, 1_000_000)
	h := newHarness(t, p)
	frame := syslog4(t, "<10>crit")
	classOfNext := func() int {
		before := h.stats()
		h.run(frame)
		return classMoved(before, h.stats())
	}
	if c := classOfNext(); c != int(tiers.SevProtected) {
		t.Fatalf("crit protected: class %d", c)
	}
	p2 := p.Clone()
	p2.Severity = &tiers.Severity{ShedFirst: []int{2}, ProtectBudget: tiers.Pct(1)}
	h.apply(p2)
	if c := classOfNext(); c != int(tiers.SevShedFirst) {
		t.Fatalf("after reload, crit shed first: class %d", c)
	}
	p3 := p.Clone()
	p3.Severity = nil
	h.apply(p3)
	if c := classOfNext(); c != -1 {
		t.Fatalf("after reload without severity, class %d counted", c)
	}
	if n := h.window().Count; n != 3 {
		t.Fatalf("window count %d after 3 packets across reloads, want 3", n)
	}
}
