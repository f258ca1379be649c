package bpf_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// facilityPolicy protects emerg and the security facilities (auth,
// authpriv, audit, alert: docs/design.md §7), sheds debug first, and samples
// every shed packet (the cap's burst, 10000, outlasts the tests' sheds).
func facilityPolicy(tb testing.TB, max uint64) tiers.Policy {
	tb.Helper()
	p := ordinalDefault()
	p.Max, p.Window = max, time.Hour
	p.Severity = &tiers.Severity{Protect: []int{0}, ProtectBudget: tiers.Pct(5), ShedFirst: []int{7},
		ProtectFacilities: []int{4, 10, 13, 14}}
	p.Record = tiers.Record{Samples: tiers.MaxRecordSamples, Snaplen: 64}
	if err := p.Validate(); err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestFacilityModel runs every facility (0..23) at severities emerg, err,
// info and debug, in random order, through the program and the model
// (model.PacketPRI) on deterministic tiers (0 % and 100 %), so that
// protection, payment and shed-first are deterministic too: packet by
// packet the action, n, the debt, the class counted, the protection and
// the payment agree, and each shed packet's sample names its facility,
// severity and class and carries the model's pass probability.
func TestFacilityModel(t *testing.T) {
	p := facilityPolicy(t, 1000)
	// Tier 1 drops all (protection runs up the debt), tier 2 none (the
	// others pay it off; shed-first in tier 1 takes tier 2's 0 %), tier 3
	// all.
	p.Tiers = []tiers.Tier{{At: tiers.Pct(50), Drop: tiers.Pct(100)}, {At: tiers.Pct(80), Drop: tiers.Pct(0)}, {At: tiers.Pct(120), Drop: tiers.Pct(100)}}
	h := newHarness(t, p)
	// The pinned settings read back (tierlimit status) name the facilities.
	if a, err := h.l.Active(); err != nil || a.Severity.Facilities != h.tab.Severity.Facilities || a.Severity.Facilities != 1<<4|1<<10|1<<13|1<<14 {
		t.Fatalf("Active: facilities %#x (%v), want %#x", a.Severity.Facilities, err, h.tab.Severity.Facilities)
	}
	rd := samplesOf(t, h)
	m := model.NewModel(p, h.tab, func() uint32 { t.Fatal("model drew a random number"); return 0 })
	var pris []int
	for fac := range tiers.NumFacilities {
		for _, sev := range []int{0, 3, 6, 7} {
			pris = append(pris, fac<<3|sev)
		}
	}
	rng := rand.New(rand.NewPCG(41, 3))
	var now uint64 = 1
	var want []model.Decision // the shed packets' decisions, in order
	var wantPRI []int
	byClass := map[string]int{}
	check := func(upTo int) {
		got := drain(t, rd)
		if len(got) != len(want) {
			t.Fatalf("packet %d: %d samples, want one per shed packet: %d", upTo, len(got), len(want))
		}
		for i, s := range got {
			d, pri := want[i], wantPRI[i]
			if s.Format != bpf.SampleFormat || s.Facility != pri>>3 || s.Severity != pri&7 || s.Class != d.Class || s.Pass != d.Pass {
				t.Fatalf("sample of <%d>: format %d facility %d severity %d class %v pass %#x; model class %v pass %#x",
					pri, s.Format, s.Facility, s.Severity, s.Class, s.Pass, d.Class, d.Pass)
			}
		}
		want, wantPRI = want[:0], wantPRI[:0]
	}
	for i := range 6000 {
		if i%1500 == 1499 {
			h.expire()
			now += uint64(p.Window) + 1
		}
		pri := pris[rng.IntN(len(pris))]
		now++
		d := m.PacketPRI(now, pri)
		before := h.stats()
		ret := h.run(syslog4(t, fmt.Sprintf("<%d>1 - h a - - - x", pri)))
		after := h.stats()
		wantRet := uint32(xdpPass)
		if d.Verdict == tiers.VerdictDrop {
			wantRet = xdpDrop
			want, wantPRI = append(want, d), append(wantPRI, pri)
		}
		if ret != wantRet || h.window().Count != d.N || h.window().Debt != m.Debt() {
			t.Fatalf("packet %d (<%d>, n=%d, tier %d, class %v): action %d debt %d, model %v debt %d",
				i, pri, d.N, d.Tier, d.Class, ret, h.window().Debt, d.Verdict, m.Debt())
		}
		if got := classMoved(before, after); got != int(d.Class) {
			t.Fatalf("packet %d (<%d>): class %d, model %v", i, pri, got, d.Class)
		}
		prot := after.ProtectedPass.Packets - before.ProtectedPass.Packets
		paid := after.PaidDrop.Packets - before.PaidDrop.Packets
		if (prot == 1) != d.Protected || (paid == 1) != d.Paid {
			t.Fatalf("packet %d (<%d>): protected %d paid %d, model %v %v", i, pri, prot, paid, d.Protected, d.Paid)
		}
		byClass[fmt.Sprintf("%v/%v", d.Class, d.Verdict)]++
		if len(want) >= 500 {
			check(i)
		}
	}
	check(6000)
	if byClass["protected/pass"] == 0 || byClass["normal/drop"] == 0 || byClass["shed_first/drop"] == 0 || byClass["protected/drop"] == 0 {
		t.Fatalf("the test exercised too little: %v", byClass)
	}
	t.Logf("6000 packets of 24 facilities × 4 severities, all as the model: %v", byClass)
}

// TestSamplePassProbability: on the seed's random tiers, each sampled shed
// packet carries the pass probability in force at its count n: ^thr of
// the model's threshold there (tiers.Table.Lookup; a shed-first packet's
// tiers.SeverityTable.ShedDrops of its tier), 0 for one dropped to pay
// the debt.
func TestSamplePassProbability(t *testing.T) {
	p := facilityPolicy(t, 1000)
	h := newHarness(t, p)
	rd := samplesOf(t, h)
	rng := rand.New(rand.NewPCG(41, 6))
	var want []uint32
	fractional := 0
	for i := range 8000 {
		if i%2000 == 0 {
			h.expire()
		}
		pri := []int{14, 15, 38, 11}[rng.IntN(4)] // user.info, user.debug, auth.info (protected), user.err
		sampled, _ := recordCounts(t, h)
		before := h.stats()
		h.run(syslog4(t, fmt.Sprintf("<%d>x", pri)))
		after := h.stats()
		if s, _ := recordCounts(t, h); s == sampled {
			continue
		}
		n := h.window().Count
		tier, thr := h.tab.Lookup(n)
		if h.tab.Severity.ClassOfPRI(pri) == tiers.SevShedFirst {
			thr = h.tab.Severity.ShedDrops[tier]
		}
		if after.PaidDrop.Packets != before.PaidDrop.Packets {
			thr = tiers.AlwaysDrop
		}
		if thr != 0 && thr != tiers.AlwaysDrop {
			fractional++
		}
		want = append(want, ^thr)
		if len(want)%500 == 0 {
			checkPass(t, drain(t, rd), want)
			want = want[:0]
		}
	}
	checkPass(t, drain(t, rd), want)
	if fractional < 100 {
		t.Fatalf("%d samples at a fractional threshold: the test exercised too little", fractional)
	}
	t.Logf("8000 packets: every sample's pass probability as the model's, %d at a fractional threshold", fractional)
}

func checkPass(t *testing.T, got []bpf.Sample, want []uint32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d samples, want %d", len(got), len(want))
	}
	for i, s := range got {
		if s.Pass != want[i] {
			t.Fatalf("sample %d: pass %#x (%.6f), want %#x", i, s.Pass, s.PassProbability(), want[i])
		}
	}
}

// TestDecodeSampleFormat1 reads a sample as an older program wrote it
// (format 1: 304 bytes, padding where format and pass are now, the data at
// byte 48), as an agent that adopts a pinned ring may find: its fields as
// they were, no facility, no pass probability.
func TestDecodeSampleFormat1(t *testing.T) {
	raw := make([]byte, 48+bpf.RecordSnapMax)
	binary.LittleEndian.PutUint64(raw[0:], 12345)
	binary.LittleEndian.PutUint32(raw[8:], 3)   // ifindex
	binary.LittleEndian.PutUint32(raw[12:], 90) // len
	binary.LittleEndian.PutUint32(raw[16:], 60) // caplen
	copy(raw[20:], []byte{2, byte(bpf.ReasonShedFirst), byte(tiers.VerdictDrop), 7, byte(tiers.SevShedFirst), 4, 24})
	copy(raw[32:], []byte{10, 1, 2, 0})
	for i := range raw[48:] {
		raw[48+i] = byte(i)
	}
	s, err := bpf.DecodeSample(raw)
	if err != nil {
		t.Fatal(err)
	}
	if s.Format != 1 || s.Facility != -1 || s.PassProbability() != -1 || s.Tier != 2 || s.Severity != 7 ||
		s.Class != tiers.SevShedFirst || s.Group != netip.MustParsePrefix("10.1.2.0/24") || len(s.Data) != 60 || s.Data[59] != 59 {
		t.Fatalf("format 1 sample read as %+v", s)
	}
	if _, err := bpf.DecodeSample(raw[:100]); err == nil {
		t.Fatal("a 100-byte sample decoded")
	}
}

// TestSamplePassSmooth: under the smooth shape a sampled packet carries
// the pass probability q(R̂) it was drawn at: ^thr of the model's
// threshold at the program's R̂ (tiers.Table.Smooth), R̂ injected far past
// max so that the packet is shed for sure but for q (about 10⁻⁴).
func TestSamplePassSmooth(t *testing.T) {
	p := tiers.Default()
	p.Window = 20 * time.Second
	p.Record = tiers.Record{Samples: tiers.MaxRecordSamples, Snaplen: 64}
	h := newHarnessOpts(t, p, bpf.Options{})
	rd := samplesOf(t, h)
	checked := 0
	for _, k := range []uint64{1e4, 3e4, 1e5} {
		h.injectEstimate(k * p.Max)
		sampled, _ := recordCounts(t, h)
		h.run(UDP4(t, 514))
		if s, _ := recordCounts(t, h); s == sampled {
			continue // passed, at q
		}
		c := h.smoothCPU()
		_, want := h.tab.Smooth(c.HiR)
		got := drain(t, rd)
		if len(got) != 1 || got[0].Pass != ^want || c.HiThr != want {
			t.Fatalf("R̂ %d: samples %+v, want one at pass %#x (model threshold %#x, the program's %#x)", c.HiR, got, ^want, want, c.HiThr)
		}
		t.Logf("R̂ %d: sample's pass probability %.3g, the model's q", c.HiR, got[0].PassProbability())
		checked++
	}
	if checked == 0 {
		t.Fatal("none of 3 packets shed: q is at most 10⁻⁴")
	}
}

// TestSamplePassOverBudget: with per-source budgets, a sampled packet
// carries the pass probability of the threshold it was judged at, in
// budget (its count's) or over (the capacity in-budget traffic leaves,
// smooth.h over_budget_thr): the model's Decision.Pass packet by packet,
// which depends on the counts alone, not on either side's draws.
func TestSamplePassOverBudget(t *testing.T) {
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, 100
	p.Sources = tiers.Sources{BudgetPackets: 5, PrefixV4: 32, PrefixV6: 64}
	p.Record = tiers.Record{Samples: tiers.MaxRecordSamples, Snaplen: 64}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, p)
	rd := samplesOf(t, h)
	// Each window starts afresh on both sides: the program's previous
	// window emptied, so that the next one expects nothing of it whatever
	// the real gap (its expect_in), and a new model.
	var m *model.Model
	fresh := func() {
		var w bpf.LimiterTlWindow
		if err := h.l.WindowMap().Lookup(uint32(0), &w); err != nil {
			t.Fatal(err)
		}
		w.StartNs, w.StartJiffies = monotonicNow(t)-uint64(p.Window)-uint64(time.Millisecond), 0
		w.Count, w.LastCount, w.ExCount, w.PrevEx, w.ExpectIn, w.ExhIn = 0, 0, 0, 0, 0, 0
		if err := h.l.WindowMap().Put(uint32(0), &w); err != nil {
			t.Fatal(err)
		}
		m = model.NewModel(p, h.tab, rand.New(rand.NewPCG(41, 9)).Uint32)
		m.SetTick(h.l.TickNs())
		m.SetSketchSeeds(h.l.SketchSeeds())
	}
	fresh()
	rng := rand.New(rand.NewPCG(41, 10))
	var want []uint32
	over, fractional := 0, 0
	now := uint64(1e9)
	for i := range 1500 {
		if i%150 == 149 { // a new window, through the fractional tiers again
			fresh()
		}
		now++
		src := netip.AddrFrom4([4]byte{198, 51, 100, byte(1 + rng.IntN(12))})
		d := m.PacketFrom(now, src)
		sampled, _ := recordCounts(t, h)
		h.run(udpFrom(t, src))
		if s, _ := recordCounts(t, h); s == sampled {
			continue
		}
		want = append(want, d.Pass)
		if d.OverBudget {
			over++
		}
		if d.Pass != 0 && d.Pass != ^uint32(0) {
			fractional++
		}
	}
	checkPass(t, drain(t, rd), want)
	if over < 100 || fractional < 20 {
		t.Fatalf("%d samples over budget, %d at a fractional threshold: the test exercised too little", over, fractional)
	}
	t.Logf("%d samples, %d over budget, %d at a fractional threshold: each one's pass probability the model's", len(want), over, fractional)
}
