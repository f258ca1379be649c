package bpf_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// accuracyPolicy has wide tiers, so 10^5 packets fit inside each, and both
// exact ends: tier 1 drops 0%, tier 4 drops 100%.
func accuracyPolicy(tb testing.TB) tiers.Policy {
	p := ordinalDefault()
	p.Window = time.Hour
	p.Max = 1_000_000
	p.Tiers = []tiers.Tier{{At: tiers.Pct(50), Drop: tiers.Pct(0)}, {At: tiers.Pct(70), Drop: tiers.Pct(20)}, {At: tiers.Pct(80), Drop: tiers.Pct(50)}, {At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	if err := p.Validate(); err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestTierAccuracy checks, at each threshold T_k: the packets n = T_k-1 and
// n = T_k land in tiers k-1 and k exactly; and 10^5 packets just below and
// just above give drop fractions within 5 sigma of the tiers' drop ratios,
// exactly 0 and 1 for 0% and 100%.
func TestTierAccuracy(t *testing.T) {
	const trials = 100_000
	h := newHarness(t, accuracyPolicy(t))
	frame := UDP4(t, 514)
	if got, want := h.tab.Bounds, []uint64{500_000, 700_000, 800_000, 1_000_000}; !equal(got, want) {
		t.Fatalf("thresholds %v, want %v", got, want)
	}
	perTier := func(a, b bpf.Stats, tier int) (pass, drop uint64) {
		return b.Selected[tier][tiers.VerdictPass].Packets - a.Selected[tier][tiers.VerdictPass].Packets,
			b.Selected[tier][tiers.VerdictDrop].Packets - a.Selected[tier][tiers.VerdictDrop].Packets
	}
	for k, T := range h.tab.Bounds {
		tier := k + 1
		// Exact to the packet.
		h.preload(T - 2)
		for i, want := range []int{tier - 1, tier} {
			s0 := h.stats()
			h.run(frame)
			s1 := h.stats()
			p, d := perTier(s0, s1, want)
			if p+d != 1 {
				t.Errorf("n=%d: not counted in tier %d", T-1+uint64(i), want)
			}
		}
		// Drop fraction, just below and just above.
		for _, side := range []struct {
			tier    int
			preload uint64
		}{{tier - 1, T - 1 - trials}, {tier, T - 1}} {
			h.preload(side.preload)
			s0 := h.stats()
			h.repeat(frame, trials)
			pass, drop := perTier(s0, h.stats(), side.tier)
			if pass+drop != trials {
				t.Fatalf("tier %d: %d+%d packets counted, want %d in the tier", side.tier, pass, drop, trials)
			}
			want := tiers.DropRatio(h.tab.Drops[side.tier])
			got := float64(drop) / trials
			bound := sigmaBound(want, trials)
			if math.Abs(got-want) > bound {
				t.Errorf("tier %d: drop fraction %.5f, want %.5f ± %.5f (5σ)", side.tier, got, want, bound)
			}
			if (want == 0 && drop != 0) || (want == 1 && pass != 0) {
				t.Errorf("tier %d: drop ratio %v is not exact: %d passed, %d dropped", side.tier, want, pass, drop)
			}
			t.Logf("tier %d: %d/%d dropped (%.4f, want %.4f ± %.4f)", side.tier, drop, trials, got, want, bound)
		}
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestWindow checks the seed's window rule on the real clock: within the
// window n counts every selected packet, dropped ones too; after the window
// the next selected packet starts n at 1.
func TestWindow(t *testing.T) {
	for _, gate := range []bool{true, false} {
		t.Run(map[bool]string{true: "gate", false: "exact"}[gate], func(t *testing.T) {
			p := ordinalDefault()
			p.Window = 200 * time.Millisecond
			p.Max = 100
			opts := bpf.Options{}
			if gate {
				opts.TickNs = kernelTick(t)
			}
			testWindow(t, newHarnessOpts(t, p, opts))
		})
	}
}

func testWindow(t *testing.T, h *harness) {
	p := h.p
	frame := UDP4(t, 514)

	h.repeat(frame, 1000) // the first packet opens a window; most are dropped
	w := h.window()
	st := h.stats()
	if w.Count != 1000 {
		t.Fatalf("window count %d after 1000 packets, want 1000", w.Count)
	}
	if d := st.SelectedTotal(tiers.VerdictDrop).Packets; d < 900 {
		t.Fatalf("%d of 1000 dropped at 10× max; the test needs drops", d)
	}
	h.run(UDP4(t, 53)) // unselected: no effect on the window
	if got := h.window().Count; got != 1000 {
		t.Fatalf("unselected packet moved the window to %d", got)
	}

	time.Sleep(p.Window + 50*time.Millisecond)
	h.run(frame)
	w2 := h.window()
	if w2.Count != 1 || w2.LastCount != 1000 || w2.Opened != w.Opened+1 {
		t.Fatalf("after the window: count %d last %d opened %d, want 1, 1000, %d", w2.Count, w2.LastCount, w2.Opened, w.Opened+1)
	}
	if w2.StartNs <= w.StartNs+uint64(p.Window) {
		t.Fatalf("new window opened at %d, not more than %v after %d", w2.StartNs, p.Window, w.StartNs)
	}
	// A packet within the window continues it.
	h.run(frame)
	if got := h.window().Count; got != 2 {
		t.Fatalf("second packet of the new window has n=%d, want 2", got)
	}
}

// TestWindowEdge sends a packet about every 500µs for 0.7 s across 50 ms
// windows and checks that every window opened at the first packet more than
// 50 ms after the previous one opened: never early, and late by no more
// than the gap between two packets. With the tick gate on this shows that
// the gate costs no accuracy at the window's edge.
func TestWindowEdge(t *testing.T) {
	for _, gate := range []bool{true, false} {
		t.Run(map[bool]string{true: "gate", false: "exact"}[gate], func(t *testing.T) {
			p := ordinalDefault()
			p.Window = 50 * time.Millisecond
			opts := bpf.Options{}
			if gate {
				opts.TickNs = kernelTick(t)
			}
			h := newHarnessOpts(t, p, opts)
			frame := UDP4(t, 514)
			h.expire()
			var prevStart, sentAt uint64
			var opened int
			deadline := time.Now().Add(700 * time.Millisecond)
			for time.Now().Before(deadline) {
				before := monotonicNow(t)
				h.run(frame)
				w := h.window()
				if w.Count == 1 {
					if prevStart != 0 {
						gap := w.StartNs - prevStart
						if gap <= uint64(p.Window) {
							t.Fatalf("window opened %v after the previous one, not more than %v", time.Duration(gap), p.Window)
						}
						// The previous packet was sent at sentAt, in the old window.
						if w.StartNs < before {
							t.Fatalf("window start %d precedes the packet's send time %d", w.StartNs, before)
						}
						if late := int64(sentAt) - int64(prevStart); late > int64(p.Window) {
							t.Fatalf("window opened late: the previous packet, at +%v, was already past the %v window", time.Duration(late), p.Window)
						}
					}
					prevStart = w.StartNs
					opened++
				}
				sentAt = before
				time.Sleep(500 * time.Microsecond)
			}
			if opened < 10 {
				t.Fatalf("only %d windows opened in 0.7 s of 50 ms windows", opened)
			}
		})
	}
}

// TestDifferential runs a mixed stream through the program and through the
// reference classifier and model.Model: every selected packet has the same
// n and tier, and the drop counts agree within 5 sigma.
func TestDifferential(t *testing.T) {
	t.Parallel() // an hour-long window, expired by hand: no clock judged
	p := testPolicy(t)
	p.Max = 2000
	p.Window = time.Hour
	h := newHarness(t, p)
	ref := model.NewModel(p, h.tab, nil)

	rng := rand.New(rand.NewPCG(1, 2))
	frames := [][]byte{
		UDP4(t, 514), UDP6(t, 514), TCP4(t, 601, true, false), TCP4(t, 601, false, true),
		TCP4(t, 22, true, false), UDP4(t, 53), UDP4(t, 5514),
		Serialize(t, Eth(layers.EthernetTypeIPv4), func() *layers.IPv4 {
			ip := IPv4(Src4, Dst4, layers.IPProtocolUDP)
			ip.SrcIP = []byte{203, 0, 113, 1}
			return ip
		}(), UDP(514), Syslog()),
		frag4(t, 9, 20, false, gopacket.Payload(make([]byte, 32))),
	}
	var modelNow uint64 = 1
	var selected, progDrops int
	var modelDrops, variance float64
	s0 := h.stats()
	for i := range 12_000 {
		if i%4000 == 3999 { // open a new window in both
			h.expire()
			modelNow += uint64(p.Window) + 1
		}
		f := frames[rng.IntN(len(frames))]
		class := model.Classify(p, f).Class
		before := h.stats()
		ret := h.run(f)
		after := h.stats()
		if class != model.ClassSelected {
			if after.SelectedTotal(tiers.VerdictPass).Packets+after.SelectedTotal(tiers.VerdictDrop).Packets !=
				before.SelectedTotal(tiers.VerdictPass).Packets+before.SelectedTotal(tiers.VerdictDrop).Packets {
				t.Fatalf("packet %d (%v) was counted as selected", i, class)
			}
			continue
		}
		selected++
		modelNow++
		d := ref.Packet(modelNow)
		if n := h.window().Count; n != d.N {
			t.Fatalf("packet %d: program n=%d, model n=%d", i, n, d.N)
		}
		tier := -1
		for k := range after.Selected {
			if after.Selected[k] != before.Selected[k] {
				tier = k
			}
		}
		if tier != d.Tier {
			t.Fatalf("packet %d (n=%d): program tier %d, model tier %d", i, d.N, tier, d.Tier)
		}
		if ret == xdpDrop {
			progDrops++
		}
		pr := tiers.DropRatio(h.tab.Drops[d.Tier])
		modelDrops += pr
		variance += pr * (1 - pr)
	}
	st := h.stats()
	if got := st.SelectedTotal(tiers.VerdictDrop).Packets - s0.SelectedTotal(tiers.VerdictDrop).Packets; got != uint64(progDrops) {
		t.Fatalf("stats count %d drops, the program returned XDP_DROP %d times", got, progDrops)
	}
	bound := 5 * math.Sqrt(variance)
	t.Logf("%d selected; drops: program %d, model mean %.1f ± %.1f (5σ)", selected, progDrops, modelDrops, bound)
	if math.Abs(float64(progDrops)-modelDrops) > bound {
		t.Fatalf("program dropped %d, model expects %.1f ± %.1f", progDrops, modelDrops, bound)
	}
}

// TestConcurrentCount runs the program on two CPUs at once: no increment
// of the shared window count is lost.
func TestConcurrentCount(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	p := ordinalDefault()
	p.Window = time.Hour
	h := newHarness(t, p)
	h.preload(0)
	frame := UDP4(t, 514)
	const perCPU, rounds = 200_000, 10
	for range rounds {
		if err := concurrently(h, frame, []int{0, 1}, []uint32{perCPU, perCPU}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := h.window().Count, uint64(2*perCPU*rounds); got != want {
		t.Fatalf("window count %d, want %d: %d increments lost", got, want, want-got)
	}
	st := h.stats()
	if got := st.SelectedTotal(tiers.VerdictPass).Packets + st.SelectedTotal(tiers.VerdictDrop).Packets; got != 2*perCPU*rounds {
		t.Fatalf("stats count %d selected packets, want %d", got, 2*perCPU*rounds)
	}
}

// TestApplySwapsWholePolicy flips between two policies: each takes effect
// at once, and the window carries on.
func TestApplySwapsWholePolicy(t *testing.T) {
	lenient := ordinalDefault()
	lenient.Window = time.Hour
	lenient.Max = 1_000_000
	strict := lenient
	strict.Max = 10
	strict.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 1514, Last: 1514}}}}
	h := newHarness(t, lenient)
	for i := range 6 {
		h.preload(100)
		if i%2 == 0 {
			h.apply(strict)
			if ret := h.run(UDP4(t, 1514)); ret != xdpDrop {
				t.Fatalf("strict policy: udp/1514 at n=101 action %d, want drop", ret)
			}
			if ret := h.run(UDP4(t, 514)); ret != xdpPass || h.window().Count != 101 {
				t.Fatalf("strict policy: udp/514 should be unselected")
			}
		} else {
			h.apply(lenient)
			if ret := h.run(UDP4(t, 514)); ret != xdpPass || h.window().Count != 101 {
				t.Fatalf("lenient policy: udp/514 action %d n=%d, want pass n=101", ret, h.window().Count)
			}
			if ret := h.run(UDP4(t, 1514)); ret != xdpPass || h.window().Count != 101 {
				t.Fatalf("lenient policy: udp/1514 should be unselected")
			}
		}
	}
}

// TestApplySwapsUnderTraffic runs packets through the program on one
// goroutine while another applies three policies in turn as fast as Apply
// allows (three, so that each slot is rewritten with a different policy
// than it held), and checks that every packet saw one whole policy: its
// action and the one counter it moved are policy A's, B's or C's answer for
// that frame, never a mix such as A's selectors with B's settings.
func TestApplySwapsUnderTraffic(t *testing.T) {
	udp := udpRules
	always := []tiers.Tier{{At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	a := ordinalDefault() // both ports, max 1: every packet in tier 1, dropped
	a.Window, a.Max, a.Tiers, a.Select = time.Hour, 1, always, udp(514, 1514)
	b := ordinalDefault() // udp/514, max 10^6: tier 0, passed
	b.Window, b.Max, b.Select = time.Hour, 1_000_000, udp(514)
	c := ordinalDefault() // udp/1514, max 1, dry-run: tier 1, would_drop
	c.Window, c.Max, c.Tiers, c.Select, c.Mode = time.Hour, 1, always, udp(1514), tiers.ModeDryRun
	h := newHarness(t, c)
	tabs := []tiers.Table{h.compile(a), h.compile(b), h.compile(c)}

	type outcome struct {
		action  uint32
		counter string
	}
	// What each frame does under A, B and C.
	want := map[string][3]outcome{
		"udp/514":  {{xdpDrop, "tier1/drop"}, {xdpPass, "tier0/pass"}, {xdpPass, "unselected"}},
		"udp/1514": {{xdpDrop, "tier1/drop"}, {xdpPass, "unselected"}, {xdpPass, "tier1/would_drop"}},
	}
	frames := map[string][]byte{"udp/514": UDP4(t, 514), "udp/1514": UDP4(t, 1514)}

	stop := make(chan struct{})
	applied := make(chan int)
	errc := make(chan error, 1)
	go func() {
		n := 0
		defer func() { applied <- n }()
		for i := 0; ; i = (i + 1) % 3 {
			select {
			case <-stop:
				return
			default:
			}
			if err := h.l.Apply(context.Background(), tabs[i]); err != nil {
				errc <- err
				return
			}
			n++
		}
	}()
	seen := map[string]int{}
	var bad string
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < 6000 && bad == "" && time.Now().Before(deadline); i++ {
		name := []string{"udp/514", "udp/1514"}[i%2]
		before := h.stats()
		got := outcome{h.run(frames[name]), ""}
		got.counter = movedCounter(before, h.stats())
		bad = fmt.Sprintf("packet %d (%s): action %d, counter %s: no whole policy gives that (A, B, C: %v)",
			i, name, got.action, got.counter, want[name])
		for k, w := range want[name] {
			if got == w {
				seen[fmt.Sprintf("%s %c", name, 'A'+k)]++
				bad = ""
			}
		}
	}
	close(stop)
	n := <-applied
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	if bad != "" {
		t.Fatal(bad)
	}
	t.Logf("%d applies; outcomes %v", n, seen)
	if len(seen) < 4 {
		t.Errorf("packets saw only %v over %d applies: the swaps did not interleave with traffic", seen, n)
	}
}

// movedCounter names the one counter of TestApplySwapsUnderTraffic that
// moved from before to after, or "other".
func movedCounter(before, after bpf.Stats) string {
	for _, c := range []struct {
		name string
		n    func(bpf.Stats) uint64
	}{
		{"unselected", func(s bpf.Stats) uint64 { return s.Unselected.Packets }},
		{"tier1/drop", func(s bpf.Stats) uint64 { return s.Selected[1][tiers.VerdictDrop].Packets }},
		{"tier1/would_drop", func(s bpf.Stats) uint64 { return s.Selected[1][tiers.VerdictWouldDrop].Packets }},
		{"tier0/pass", func(s bpf.Stats) uint64 { return s.Selected[0][tiers.VerdictPass].Packets }},
	} {
		if c.n(after) != c.n(before) {
			return c.name
		}
	}
	return "other"
}

// udpRules is one select rule for each UDP port.
func udpRules(ports ...uint16) []tiers.Rule {
	var r []tiers.Rule
	for _, p := range ports {
		r = append(r, tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: p, Last: p}}})
	}
	return r
}

func TestApplyRefusesWhatDoesNotFit(t *testing.T) {
	h := newHarness(t, ordinalDefault())
	p := ordinalDefault()
	tab, err := tiers.Compile(p, h.l.Tick())
	if err != nil {
		t.Fatal(err)
	}
	tab.Thresholds = tab.Thresholds[:0]
	if err := h.l.Apply(context.Background(), tab); !errors.Is(err, bpf.ErrPolicy) {
		t.Fatalf("empty table: got %v, want ErrPolicy", err)
	}
	// The old policy still runs.
	h.preload(1_000_000)
	if ret := h.run(UDP4(t, 514)); ret != xdpDrop {
		t.Fatalf("after a refused apply, action %d, want drop", ret)
	}
}

// TestModes: dry-run counts would_drop and passes; off passes and counts.
func TestModes(t *testing.T) {
	p := ordinalDefault()
	p.Window = time.Hour
	h := newHarness(t, p)
	frame := UDP4(t, 514)
	for _, tc := range []struct {
		mode tiers.Mode
		want tiers.Verdict
	}{{tiers.ModeDryRun, tiers.VerdictWouldDrop}, {tiers.ModeOff, tiers.VerdictPass}, {tiers.ModeEnforce, tiers.VerdictDrop}} {
		p.Mode = tc.mode
		h.apply(p)
		h.preload(1_000_000)
		s0 := h.stats()
		ret := h.repeat(frame, 100)
		s1 := h.stats()
		last := len(p.Tiers)
		if got := s1.Selected[last][tc.want].Packets - s0.Selected[last][tc.want].Packets; got != 100 {
			t.Errorf("%v: %d of 100 packets counted %v, want 100", tc.mode, got, tc.want)
		}
		wantRet := uint32(xdpPass)
		if tc.mode == tiers.ModeEnforce {
			wantRet = xdpDrop
		}
		if ret != wantRet {
			t.Errorf("%v: action %d, want %d", tc.mode, ret, wantRet)
		}
		if n := h.window().Count; n != 1_000_100 {
			t.Errorf("%v: window count %d, want 1000100", tc.mode, n)
		}
	}
}

// TestActiveReadsBackThePolicy: Active recovers mode, window, max, the tier
// starts and drop ratios from the maps, for an exact table and for one
// compiled at a coarser step.
func TestActiveReadsBackThePolicy(t *testing.T) {
	for _, max := range []uint64{40000, 100_000_003} {
		p := ordinalDefault()
		p.Max, p.Mode, p.Window = max, tiers.ModeDryRun, 250*time.Millisecond
		p.Tiers = []tiers.Tier{{At: tiers.Pct(50), Drop: tiers.Pct(0)}, {At: tiers.Pct(70), Drop: tiers.MustParsePercent("12.5")}, {At: tiers.MustParsePercent("70.5"), Drop: tiers.Pct(50)}, {At: tiers.Pct(120), Drop: tiers.Pct(100)}}
		h := newHarness(t, p)
		a, err := h.l.Active()
		if err != nil {
			t.Fatal(err)
		}
		if a.Mode != p.Mode || a.Window != p.Window || a.Max != max || a.Shift != h.tab.Shift || a.TableLen != len(h.tab.Thresholds) {
			t.Fatalf("max %d: Active %+v does not match the policy", max, a)
		}
		for k := range p.Tiers {
			if want := h.tab.TierStart(k + 1); a.Bounds[k] != want {
				t.Errorf("max %d: tier %d starts at %d, the table says %d", max, k+1, a.Bounds[k], want)
			}
			if a.Drops[k+1] != h.tab.Drops[k+1] {
				t.Errorf("max %d: tier %d drop threshold %#x, compiled %#x", max, k+1, a.Drops[k+1], h.tab.Drops[k+1])
			}
			// round(drop × 2^32) is within 2^-33 of the configured ratio.
			if want := p.Tiers[k].Drop.Ratio(); math.Abs(a.DropRatios[k+1]-want) > 0x1p-33 {
				t.Errorf("max %d: tier %d drop ratio %v, want %v ± 2^-33", max, k+1, a.DropRatios[k+1], want)
			}
		}
		t.Logf("max %d: step 2^%d, tiers start at %v", max, a.Shift, a.Bounds)
	}
}
