package tiers

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"sort"
	"testing"
	"time"
)

// fleetStream is one stream of a member's selected packets: rate packets
// per window from srcs in turn, evenly spaced from a random phase, or,
// with span, evenly spaced over that part of each window (a fraction of
// it) and only the first keep of each window when keep > 0.
type fleetStream struct {
	member int
	srcs   []netip.Addr
	rate   float64
	span   [2]float64
	keep   int
}

// fleetStreams offers streams to f for windows windows and returns each
// stream's offered and passed packets from window from on.
func fleetStreams(f *FleetModel, window time.Duration, streams []fleetStream, windows, from int, rng *rand.Rand) (offered, passed []int) {
	W := float64(window)
	type event struct {
		at     float64
		stream int
	}
	var evs []event
	for i, s := range streams {
		if s.span[1] == 0 {
			for at := rng.Float64() * W / s.rate; at < float64(windows)*W; at += W / s.rate {
				evs = append(evs, event{at, i})
			}
			continue
		}
		step := (s.span[1] - s.span[0]) * W / s.rate
		for k := range windows {
			for j := 0; j < int(s.rate) && (s.keep == 0 || j < s.keep); j++ {
				evs = append(evs, event{float64(k)*W + s.span[0]*W + float64(j)*step, i})
			}
		}
	}
	sort.Slice(evs, func(a, b int) bool { return evs[a].at < evs[b].at })
	offered, passed = make([]int, len(streams)), make([]int, len(streams))
	turn := make([]int, len(streams))
	for _, e := range evs {
		s := streams[e.stream]
		d := f.PacketFrom(s.member, uint64(e.at), s.srcs[turn[e.stream]%len(s.srcs)])
		turn[e.stream]++
		if int(e.at/W) >= from {
			offered[e.stream]++
			if d.Verdict == VerdictPass {
				passed[e.stream]++
			}
		}
	}
	return offered, passed
}

// lightGroups is n sources of member m, one per /32 group.
func lightGroups(m, n int) []netip.Addr {
	a := make([]netip.Addr, n)
	for i := range a {
		a[i] = netip.AddrFrom4([4]byte{10, byte(m), 0, byte(i + 1)})
	}
	return a
}

// fleetTally sums runs' offered and passed packets by stream, over seeds.
type fleetTally struct {
	off, pass []int
}

func (t *fleetTally) add(off, pass []int) {
	if t.off == nil {
		t.off, t.pass = make([]int, len(off)), make([]int, len(off))
	}
	for i := range off {
		t.off[i] += off[i]
		t.pass[i] += pass[i]
	}
}

// frac is stream i's passed fraction and its variance (binomial).
func (t *fleetTally) frac(i int) (f, variance float64) {
	n := float64(t.off[i])
	f = float64(t.pass[i]) / n
	return f, f * (1 - f) / n
}

// total is the passes of all streams and their variance (binomial, per
// stream).
func (t *fleetTally) total() (pass, variance float64) {
	for i := range t.off {
		_, v := t.frac(i)
		n := float64(t.off[i])
		pass += float64(t.pass[i])
		variance += v * n * n
	}
	return pass, variance
}

// Per-source budgets in a fleet (docs/design.md §12, §6), on the model:
// three members of fleet.max 1000, each member's budget 5 % of its own
// max 1000 (50 packets per group and window); light groups of 20 packets
// per window on every member (600, 600, 300 per window) and one noisy
// group of 1500 per window on member 0, so the fleet is offered 3 ×
// fleet.max. Over seeds, from the third window on, within 5σ:
//   - the light groups on the noisy member lose nothing to it: they pass
//     what they pass when its over-budget packets do not exist, and far
//     more than without budgets;
//   - the light groups on the other members pass what they pass without
//     budgets (the noisy member's report, all its traffic, is in-budget
//     load to them);
//   - the fleet passes no more than without budgets.
//
// Then with a second noisy group on member 1 the fleet still passes no
// more than without budgets, and with light load low as well: there, had
// members reported their in-budget R̂ alone, each noisy member would take
// all the capacity the light groups leave, and the fleet passed 55,304
// where it passes 41,147 without budgets (34 % more). Reporting all
// their traffic, the members pass 10,079: each member takes the others'
// over-budget traffic as in budget, so two noisy members leave each other
// the last tier's rate alone (docs/design.md §12 states the cost).
func TestFleetModelBudgets(t *testing.T) {
	const (
		fleetMax = 1000
		window   = time.Second
		windows  = 8
		from     = 2
		seeds    = 8
	)
	p := fleetPolicy(t, fleetMax, 1000)
	p.Sources = Sources{Budget: Pct(5), PrefixV4: 32, PrefixV6: 64}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	tab := mustCompile(t, p)
	if tab.Sources.Budget != 50 {
		t.Fatalf("budget %d packets, want 5 %% of the member's own max 1000 = 50 (not of fleet.max)", tab.Sources.Budget)
	}
	plain := p.Clone()
	plain.Sources = Sources{}
	plainTab := mustCompile(t, plain)
	noisy := func(m int) []netip.Addr { return []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(m + 1)})} }
	light := []fleetStream{{member: 0, srcs: lightGroups(0, 30), rate: 600}, {member: 1, srcs: lightGroups(1, 30), rate: 600}, {member: 2, srcs: lightGroups(2, 15), rate: 300}}
	// The noisy groups send over [5 %, 95 %] of each window, inside the
	// member's windows (which open at the first packet past the last's
	// end, a few ms later each window).
	span := [2]float64{0.05, 0.95}
	oneNoisy := append(append([]fleetStream(nil), light...), fleetStream{0, noisy(0), 1500, span, 0})
	twoNoisy := append(append([]fleetStream(nil), oneNoisy...), fleetStream{1, noisy(1), 1500, span, 0})

	run := func(pol Policy, tb Table, streams []fleetStream, salt uint64) *fleetTally {
		var tally fleetTally
		for seed := range uint64(seeds) {
			rng := rand.New(rand.NewPCG(seed, salt))
			f := NewFleetModel(pol, tb, 3, 0, rng.Uint32)
			for i := range 3 {
				f.Member(i).SetSketchSeeds(randomSeeds(rng)) // each host draws its own, as the program at load
			}
			tally.add(fleetStreams(f, window, streams, windows, from, rng))
		}
		return &tally
	}
	budgets := run(p, tab, oneNoisy, 1)
	without := run(plain, plainTab, oneNoisy, 2)
	// The noisy group's in-budget packets alone (its first 50 of each
	// window, at the same times): the over-budget packets do not exist.
	atBudget := append(append([]fleetStream(nil), light...), fleetStream{0, noisy(0), 1500, span, int(tab.Sources.Budget)})
	silent := run(p, tab, atBudget, 3)

	// Light groups on the noisy member: as when it is silent, and more
	// than without budgets.
	fa, va := budgets.frac(0)
	fs, vs := silent.frac(0)
	fw, vw := without.frac(0)
	t.Logf("member 0's light groups pass %.4f beside the noisy group, %.4f with its over-budget packets away, %.4f without budgets", fa, fs, fw)
	if math.Abs(fa-fs) > 5*math.Sqrt(va+vs) {
		t.Errorf("member 0's light groups pass %.4f beside the noisy group, want %.4f (its over-budget packets away) ± 5 × %.4f", fa, fs, math.Sqrt(va+vs))
	}
	if fa < fw+5*math.Sqrt(va+vw) {
		t.Errorf("member 0's light groups pass %.4f with budgets, want more than %.4f (without budgets) + 5σ", fa, fw)
	}
	// Light groups elsewhere: as without budgets.
	for i := 1; i <= 2; i++ {
		fa, va := budgets.frac(i)
		fw, vw := without.frac(i)
		t.Logf("member %d's light groups pass %.4f with budgets, %.4f without", i, fa, fw)
		if math.Abs(fa-fw) > 5*math.Sqrt(va+vw) {
			t.Errorf("member %d's light groups pass %.4f with budgets, want %.4f (without budgets) ± 5 × %.4f", i, fa, fw, math.Sqrt(va+vw))
		}
	}
	// The fleet: no more than without budgets.
	checkNoMore := func(name string, streams []fleetStream, with, plain *fleetTally) {
		t.Helper()
		a, va := with.total()
		w, vw := plain.total()
		r := totalRate(streams)
		t.Logf("%s: the fleet passed %.0f with budgets, %.0f without, over %d seeds × %d windows (R %.0f, P(R) %.0f per window)",
			name, a, w, seeds, windows-from, r, plainTab.Expected(uint64(r)).Passed)
		if a > w+5*math.Sqrt(va+vw) {
			t.Errorf("%s: the fleet passed %.0f with budgets, want at most %.0f (without budgets) + 5 × %.1f", name, a, w, math.Sqrt(va+vw))
		}
	}
	checkNoMore("one noisy group", oneNoisy, budgets, without)
	checkNoMore("two noisy groups", twoNoisy, run(p, tab, twoNoisy, 4), run(plain, plainTab, twoNoisy, 5))
	// Two noisy groups of fleet.max each beside light load (0.25 ×
	// fleet.max): the over-budget packets take the capacity up the tiers,
	// where P bends.
	lightLow := []fleetStream{{member: 0, srcs: lightGroups(0, 5), rate: 100}, {member: 1, srcs: lightGroups(1, 5), rate: 100}, {member: 2, srcs: lightGroups(2, 3), rate: 50}}
	lowNoisy := append(append([]fleetStream(nil), lightLow...), fleetStream{0, noisy(0), 1000, span, 0}, fleetStream{1, noisy(1), 1000, span, 0})
	checkNoMore("two noisy groups, light load low", lowNoisy, run(p, tab, lowNoisy, 6), run(plain, plainTab, lowNoisy, 7))
}

// totalRate is the packets per window of streams.
func totalRate(streams []fleetStream) float64 {
	var r float64
	for _, s := range streams {
		r += s.rate
	}
	return r
}

// A budget's percent is of the member's own max, the max it judges on
// alone (docs/design.md §12): the policy's max, not fleet.max; in
// fallback share, fleet.max ÷ the members, its max then.
func TestFleetSourcesBudget(t *testing.T) {
	p := fleetPolicy(t, 200000, 1000)
	p.Sources = Sources{Budget: Pct(10), PrefixV4: 32, PrefixV6: 64}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := mustCompile(t, p).Sources.Budget; got != 100 {
		t.Errorf("budget 10 %% with max 1000, fleet.max 200000: %d packets, want 100", got)
	}
	if got := mustCompile(t, p.FleetFallbackPolicy(4)).Sources.Budget; got != 5000 {
		t.Errorf("in fallback share of 4 members: %d packets, want 10 %% of 50000 = 5000", got)
	}
	p.Fleet.Fallback = FallbackLocal
	if got := mustCompile(t, p.FleetFallbackPolicy(4)).Sources.Budget; got != 100 {
		t.Errorf("in fallback local: %d packets, want 100", got)
	}
}
