package bpf_test

import (
	"bytes"
	"errors"
	"math"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// recordPolicy drops every packet from n = 11 on (one tier at 10 packets,
// drop 100%), in an hour-long window, sampling up to samples per second.
func recordPolicy(tb testing.TB, samples uint32) tiers.Policy {
	tb.Helper()
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, 10
	p.Tiers = []tiers.Tier{{At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	p.Record = tiers.Record{Samples: samples, Snaplen: 256}
	if err := p.Validate(); err != nil {
		tb.Fatal(err)
	}
	return p
}

// drain reads every sample the ring holds now.
func drain(tb testing.TB, rd *bpf.SampleReader) []bpf.Sample {
	tb.Helper()
	var out []bpf.Sample
	for {
		rd.SetDeadline(time.Now().Add(50 * time.Millisecond))
		s, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, s)
	}
}

func samplesOf(tb testing.TB, h *harness) *bpf.SampleReader {
	tb.Helper()
	rd, err := h.l.Samples()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rd.Close() })
	return rd
}

func recordCounts(tb testing.TB, h *harness) (sampled, lost uint64) {
	tb.Helper()
	s, l, err := h.l.RecordCounts()
	if err != nil {
		tb.Fatal(err)
	}
	return s, l
}

// TestRecordReasons sheds a packet for each reason and checks its sample:
// tier, reason, verdict, severity, group and the frame's first snaplen
// bytes.
func TestRecordReasons(t *testing.T) {
	src6 := netip.MustParseAddr("2001:db8:7::99")
	payload := gopacket.Payload(make([]byte, 64))
	for _, c := range []struct {
		name   string
		policy func(p *tiers.Policy)
		frames func(t *testing.T, h *harness) []byte // the last frame is the one sampled
		want   bpf.Sample
	}{
		{"tier", nil, func(t *testing.T, h *harness) []byte {
			return udpFrom(t, netip.AddrFrom4([4]byte(Src4)))
		}, bpf.Sample{Tier: 1, Reason: bpf.ReasonTier, Verdict: tiers.VerdictDrop, Severity: -1,
			Group: netip.MustParsePrefix("192.0.2.1/32")}},
		{"dry-run, grouped /24", func(p *tiers.Policy) {
			p.Mode = tiers.ModeDryRun
			p.Sources = tiers.Sources{BudgetPackets: 10, PrefixV4: 24, PrefixV6: 48}
		}, func(t *testing.T, h *harness) []byte {
			return udpFrom(t, netip.AddrFrom4([4]byte(Src4)))
		}, bpf.Sample{Tier: 1, Reason: bpf.ReasonTier, Verdict: tiers.VerdictWouldDrop, Severity: -1,
			Group: netip.MustParsePrefix("192.0.2.0/24")}},
		{"over budget, IPv6 /48", func(p *tiers.Policy) {
			p.Max = 1000
			p.Tiers = []tiers.Tier{{At: tiers.Pct(1), Drop: tiers.Pct(100)}}
			p.Sources = tiers.Sources{BudgetPackets: 1, PrefixV4: 24, PrefixV6: 48}
		}, func(t *testing.T, h *harness) []byte {
			h.run(udpFrom(t, src6)) // within budget, dropped by its tier
			return udpFrom(t, src6)
		}, bpf.Sample{Tier: -1, Reason: bpf.ReasonOverBudget, Verdict: tiers.VerdictDrop, Severity: -1,
			Group: netip.MustParsePrefix("2001:db8:7::/48")}},
		{"shed_first", func(p *tiers.Policy) {
			p.Tiers = []tiers.Tier{{At: tiers.Pct(100), Drop: tiers.Pct(0)}, {At: tiers.Pct(1000), Drop: tiers.Pct(100)}}
			p.Severity = &tiers.Severity{ShedFirst: []int{7}}
		}, func(t *testing.T, h *harness) []byte {
			h.preload(50) // tier 1, drop 0%: debug is judged at tier 2's 100%
			return syslog4(t, "<15>1 - - - - - - debug")
		}, bpf.Sample{Tier: 1, Reason: bpf.ReasonShedFirst, Verdict: tiers.VerdictDrop, Severity: 7,
			Class: tiers.SevShedFirst, Group: netip.MustParsePrefix("192.0.2.1/32")}},
		// Issue 33 item 6: the group budgets use, NAT64 and 6to4
		// mapped to their IPv4 senders; none for a frame too deep in
		// VLAN tags to have a header the parser knows.
		{"NAT64 source, grouped /24", func(p *tiers.Policy) {
			p.Sources = tiers.Sources{BudgetPackets: 10, PrefixV4: 24, PrefixV6: 48}
		}, func(t *testing.T, h *harness) []byte {
			return udpFrom(t, netip.MustParseAddr("64:ff9b::c000:201"))
		}, bpf.Sample{Tier: 1, Reason: bpf.ReasonTier, Verdict: tiers.VerdictDrop, Severity: -1,
			Group: netip.MustParsePrefix("192.0.2.0/24")}},
		{"6to4 source, grouped /24", func(p *tiers.Policy) {
			p.Sources = tiers.Sources{BudgetPackets: 10, PrefixV4: 24, PrefixV6: 48}
		}, func(t *testing.T, h *harness) []byte {
			return udpFrom(t, netip.MustParseAddr("2002:c000:201::1"))
		}, bpf.Sample{Tier: 1, Reason: bpf.ReasonTier, Verdict: tiers.VerdictDrop, Severity: -1,
			Group: netip.MustParsePrefix("192.0.2.0/24")}},
		{"three VLAN tags: no group", nil, func(t *testing.T, h *harness) []byte {
			return withTags(udpFrom(t, netip.AddrFrom4([4]byte(Src4))), 0x8100, 0, 0, 0)
		}, bpf.Sample{Tier: 1, Reason: bpf.ReasonTier, Verdict: tiers.VerdictDrop, Severity: -1}},
		{"fragment", nil, func(t *testing.T, h *harness) []byte {
			if ret := h.run(frag4(t, 7, 0, true, UDP(514), payload)); ret != xdpDrop {
				t.Fatalf("first fragment: action %d", ret)
			}
			return frag4(t, 7, 10, false, payload)
		}, bpf.Sample{Tier: -1, Reason: bpf.ReasonFragment, Verdict: tiers.VerdictDrop, Severity: -1,
			Group: netip.MustParsePrefix("192.0.2.1/32")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // a program each, no clock: the cases run two at a time
			p := recordPolicy(t, 1000)
			p.Record.Snaplen = 40
			if c.policy != nil {
				c.policy(&p)
			}
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, p)
			rd := samplesOf(t, h)
			h.preload(1000)
			frame := c.frames(t, h)
			drain(t, rd) // the fragment case's first
			t0 := monotonicNow(t)
			h.run(frame)
			got := drain(t, rd)
			if len(got) != 1 {
				t.Fatalf("%d samples, want 1: %+v", len(got), got)
			}
			s := got[0]
			if s.Tier != c.want.Tier || s.Reason != c.want.Reason || s.Verdict != c.want.Verdict ||
				s.Severity != c.want.Severity || s.Class != c.want.Class || s.Group != c.want.Group {
				t.Errorf("sample tier=%d reason=%s verdict=%d sev=%d class=%d group=%s, want %+v",
					s.Tier, s.Reason, s.Verdict, s.Severity, s.Class, s.Group, c.want)
			}
			if s.Len != len(frame) || !bytes.Equal(s.Data, frame[:40]) {
				t.Errorf("sample len %d data %x, want %d %x", s.Len, s.Data, len(frame), frame[:40])
			}
			if m := uint64(s.Mono); m < t0 || m > monotonicNow(t) {
				t.Errorf("sample time %d outside the run [%d, now]", m, t0)
			}
		})
	}
}

// TestRecordNothingOnPass: passed packets, and drops with sampling off,
// leave no sample and do not touch the bucket.
func TestRecordNothingOnPass(t *testing.T) {
	frame := udpFrom(t, netip.AddrFrom4([4]byte(Src4)))
	h := newHarness(t, recordPolicy(t, 1000))
	rd := samplesOf(t, h)
	if ret := h.repeat(frame, 9); ret != xdpPass {
		t.Fatalf("action %d, want pass", ret)
	}
	p := recordPolicy(t, 0)
	p.Record.Snaplen = 0
	h.apply(p)
	if ret := h.repeat(frame, 1000); ret != xdpDrop {
		t.Fatalf("action %d, want drop", ret)
	}
	if got := drain(t, rd); len(got) != 0 {
		t.Errorf("%d samples, want none", len(got))
	}
	if s, l := recordCounts(t, h); s != 0 || l != 0 {
		t.Errorf("record_cpu sampled %d lost %d, want 0 0", s, l)
	}
	var g bpf.LimiterTlRecordGate
	if err := h.l.RecordGate().Lookup(uint32(0), &g); err != nil {
		t.Fatal(err)
	}
	if g != (bpf.LimiterTlRecordGate{}) {
		t.Errorf("gate touched with sampling off: %+v", g)
	}
}

// TestRecordCap floods the drop path on 1 and 2 CPUs at once, at any
// offered rate the test run reaches, and holds the samples taken (written
// or lost to a full ring) to cap × (elapsed + one tick) + the burst, and
// to at least half of cap × elapsed: one CPU alone gets the whole cap.
func TestRecordCap(t *testing.T) {
	frame := udpFrom(t, netip.AddrFrom4([4]byte(Src4)))
	for _, c := range []struct {
		cap  uint32
		cpus int
		runs uint32
	}{
		{1000, 1, 2_000_000},
		{1000, 2, 2_000_000},
		{10, 2, 1_000_000},
		{50000, 2, 1_000_000},
	} {
		if c.cpus > runtime.NumCPU() {
			t.Logf("cap %d on %d CPUs: %d CPUs here", c.cap, c.cpus, runtime.NumCPU())
			continue
		}
		h := newHarness(t, recordPolicy(t, c.cap))
		h.preload(1000)
		cpus := make([]int, c.cpus)
		counts := make([]uint32, c.cpus)
		for i := range cpus {
			cpus[i], counts[i] = i, c.runs
		}
		t0 := time.Now()
		if _, err := pinnedRuns(h.l.Program(), frame, cpus, counts); err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(t0)
		sampled, lost := recordCounts(t, h)
		burst := bpf.RecordBurst(c.cap)
		tick := time.Duration(h.l.TickNs())
		bound := uint64(float64(c.cap)*(elapsed+tick).Seconds()) + burst
		t.Logf("cap %d/s, %d CPUs, %d drops each in %v: %d samples (%d lost), bound %d",
			c.cap, c.cpus, c.runs, elapsed, sampled, lost, bound)
		if sampled+lost > bound || sampled+lost == 0 {
			t.Errorf("cap %d/s on %d CPUs: %d samples in %v, want 1..%d", c.cap, c.cpus, sampled+lost, elapsed, bound)
		}
		// The floor is loose: a run that the scheduler holds off its CPU
		// takes no samples meanwhile.
		if low := uint64(float64(c.cap) * elapsed.Seconds() / 2); sampled+lost < low {
			t.Errorf("cap %d/s on %d CPUs: %d samples in %v, want at least %d", c.cap, c.cpus, sampled+lost, elapsed, low)
		}
		if st := h.stats(); st.Selected[1][tiers.VerdictDrop].Packets < uint64(c.cpus)*uint64(c.runs) {
			t.Errorf("drops %d, want %d", st.Selected[1][tiers.VerdictDrop].Packets, uint64(c.cpus)*uint64(c.runs))
		}
	}
}

// TestRecordIPv6Data: an IPv6 frame's sample keeps the frame up to the
// snaplen (the whole frame when it is shorter).
func TestRecordSnaplen(t *testing.T) {
	for _, snap := range []uint32{1, 7, 8, 9, 63, 256} {
		p := recordPolicy(t, 1000)
		p.Record.Snaplen = snap
		h := newHarness(t, p)
		rd := samplesOf(t, h)
		h.preload(1000)
		frame := Serialize(t, Eth(layers.EthernetTypeIPv6), IPv6(Src6, Dst6, layers.IPProtocolUDP), UDP(514),
			gopacket.Payload(bytes.Repeat([]byte("x"), 100)))
		h.run(frame)
		got := drain(t, rd)
		want := frame[:min(int(snap), len(frame))]
		if len(got) != 1 || !bytes.Equal(got[0].Data, want) {
			t.Errorf("snaplen %d: samples %+v, want data %x", snap, got, want)
		}
	}
}

// TestRecordShare: with a share of 0 no shed packet is eligible, whatever
// the gate allows; with about half, about half of a slow trickle is
// sampled (5σ); back at 1, every one the gate allows.
func TestRecordShare(t *testing.T) {
	frame := udpFrom(t, netip.AddrFrom4([4]byte(Src4)))
	h := newHarness(t, recordPolicy(t, tiers.MaxRecordSamples))
	h.preload(1000)
	count := func(share float64, n int) uint64 {
		t.Helper()
		if err := h.l.SetRecordShare(share); err != nil {
			t.Fatal(err)
		}
		s0, l0 := recordCounts(t, h)
		for range n {
			h.run(frame)
		}
		s1, l1 := recordCounts(t, h)
		return s1 + l1 - s0 - l0
	}
	if got := count(0, 200); got != 0 {
		t.Errorf("share 0: %d samples, want none", got)
	}
	const n = 2000 // one test run each: far below the cap's 100000/s
	if got := count(0.5, n); math.Abs(float64(got)-n/2) > 5*math.Sqrt(n*0.25) {
		t.Errorf("share 0.5: %d samples of %d, want %d ± %.0f", got, n, n/2, 5*math.Sqrt(n*0.25))
	}
	if got := count(1, 200); got < 190 {
		t.Errorf("share 1: %d samples of 200, want about all", got)
	}
}

// Issue 32 row 8: the gate is pinned, and its clock is jiffies × tick
// under the tick gate, else bpf_ktime_get_ns: an agent restarted with the
// other one finds tat about 199 days ahead (INITIAL_JIFFIES × tick). The
// program reads a tat further ahead than its own clock can have set as
// the other clock's and starts the gate again: samples still flow. It
// took none (31 samples, then 0).
func TestRecordClockChange(t *testing.T) {
	frame := udpFrom(t, netip.AddrFrom4([4]byte(Src4)))
	h := newHarnessOpts(t, recordPolicy(t, 1000), bpf.Options{})
	h.preload(1000)
	ahead := bpf.LimiterTlRecordGate{Tat: monotonicNow(t) + uint64(199*24*time.Hour)}
	if err := h.l.RecordGate().Put(uint32(0), &ahead); err != nil {
		t.Fatal(err)
	}
	h.repeat(frame, 1000)
	sampled, lost := recordCounts(t, h)
	t.Logf("tat 199 days ahead of the clock: %d samples (%d lost) in 1,000 drops", sampled, lost)
	if sampled+lost == 0 {
		t.Error("no sample after the gate's clock changed")
	}
	// A tat within the gate's reach still holds: no sample before it.
	near := bpf.LimiterTlRecordGate{Tat: monotonicNow(t) + uint64(500*time.Millisecond)}
	if err := h.l.RecordGate().Put(uint32(0), &near); err != nil {
		t.Fatal(err)
	}
	before, _ := recordCounts(t, h)
	h.repeat(frame, 1000)
	if after, _ := recordCounts(t, h); after != before {
		t.Errorf("tat 500 ms ahead (burst %d, tau %v): %d samples, want none", bpf.RecordBurst(1000), time.Duration((bpf.RecordBurst(1000)-1)*uint64(time.Millisecond)), after-before)
	}
}
