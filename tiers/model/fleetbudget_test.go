package model

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
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
			if d.Verdict == tiers.VerdictPass {
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
// fleet.max. Members report R̂_in and R̂_tot; each judges its in-budget
// packets on R̂_in + the others' in-budget sum and its over-budget ones on
// the share of P(R̂_tot + the others' total) − P(R̂_in + the others' in).
// Over seeds, from the third window on, within 5σ:
//   - the light groups on every member lose nothing to the noisy group:
//     they pass at least what they pass when its over-budget packets do
//     not exist, and far more than without budgets;
//   - the fleet passes P(R_fleet), what it passes without budgets: not
//     more, and not less (before the two sums, each member took the
//     others' over-budget traffic as in budget, and the fleet passed
//     29,937 here where it passes 42,162 without budgets).
//
// Then with a second noisy group on member 1, and with two noisy groups
// of fleet.max each beside light load low (there P bends, and had members
// reported their in-budget R̂ alone as one sum, each noisy member would
// take all the capacity the light groups leave, and the fleet passed 34 %
// more than without budgets): the fleet passes as without budgets (it
// passed 20,666 against 42,213 with one sum of all traffic), and the light
// groups on both noisy members lose nothing.
func TestFleetModelBudgets(t *testing.T) {
	const (
		fleetMax = 1000
		window   = time.Second
		windows  = 8
		from     = 2
		seeds    = 8
	)
	p := fleetPolicy(t, fleetMax, 1000)
	p.Sources = tiers.Sources{Budget: tiers.Pct(5), PrefixV4: 32, PrefixV6: 64}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	tab := mustCompile(t, p)
	if tab.Sources.Budget != 50 {
		t.Fatalf("budget %d packets, want 5 %% of the member's own max 1000 = 50 (not of fleet.max)", tab.Sources.Budget)
	}
	plain := p.Clone()
	plain.Sources = tiers.Sources{}
	plainTab := mustCompile(t, plain)
	noisy := func(m int) []netip.Addr { return []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(m + 1)})} }
	light := []fleetStream{{member: 0, srcs: lightGroups(0, 30), rate: 600}, {member: 1, srcs: lightGroups(1, 30), rate: 600}, {member: 2, srcs: lightGroups(2, 15), rate: 300}}
	// The noisy groups send over [5 %, 95 %] of each window, inside the
	// member's windows (which open at the first packet past the last's
	// end, a few ms later each window).
	span := [2]float64{0.05, 0.95}
	with := func(base []fleetStream, extra ...fleetStream) []fleetStream {
		return append(append([]fleetStream(nil), base...), extra...)
	}
	// atBudget is a noisy stream's in-budget packets alone (its first
	// budget of each window, at the same times): the over-budget packets
	// do not exist.
	atBudget := func(s fleetStream) fleetStream { s.keep = int(tab.Sources.Budget); return s }
	run := func(pol tiers.Policy, tb tiers.Table, streams []fleetStream, salt uint64) *fleetTally {
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
	// Light groups: at least what they pass when the noisy groups'
	// over-budget packets are away, and more than without budgets.
	checkLight := func(name string, members int, budgets, silent, without *fleetTally) {
		t.Helper()
		for i := range members {
			fa, va := budgets.frac(i)
			fs, vs := silent.frac(i)
			fw, vw := without.frac(i)
			t.Logf("%s: member %d's light groups pass %.4f with budgets, %.4f with the over-budget packets away, %.4f without budgets", name, i, fa, fs, fw)
			if fa < fs-5*math.Sqrt(va+vs) {
				t.Errorf("%s: member %d's light groups pass %.4f, want at least %.4f (the over-budget packets away) − 5 × %.4f", name, i, fa, fs, math.Sqrt(va+vs))
			}
			if fa < fw+5*math.Sqrt(va+vw) {
				t.Errorf("%s: member %d's light groups pass %.4f with budgets, want more than %.4f (without budgets) + 5σ", name, i, fa, fw)
			}
		}
	}
	// The fleet: P(R_fleet), as without budgets, not more and not less.
	checkFleet := func(name string, streams []fleetStream, with, plain *fleetTally) {
		t.Helper()
		a, va := with.total()
		w, vw := plain.total()
		r := totalRate(streams)
		t.Logf("%s: the fleet passed %.0f with budgets, %.0f without, over %d seeds × %d windows (R %.0f, P(R) %.0f per window)",
			name, a, w, seeds, windows-from, r, plainTab.Expected(uint64(r)).Passed)
		if math.Abs(a-w) > 5*math.Sqrt(va+vw) {
			t.Errorf("%s: the fleet passed %.0f with budgets, want %.0f (without budgets, P(R_fleet)) ± 5 × %.1f", name, a, w, math.Sqrt(va+vw))
		}
	}

	noisy0 := fleetStream{0, noisy(0), 1500, span, 0}
	oneNoisy := with(light, noisy0)
	budgets := run(p, tab, oneNoisy, 1)
	without := run(plain, plainTab, oneNoisy, 2)
	checkLight("one noisy group", 3, budgets, run(p, tab, with(light, atBudget(noisy0)), 3), without)
	checkFleet("one noisy group", oneNoisy, budgets, without)

	noisy1 := fleetStream{1, noisy(1), 1500, span, 0}
	twoNoisy := with(oneNoisy, noisy1)
	budgets, without = run(p, tab, twoNoisy, 4), run(plain, plainTab, twoNoisy, 5)
	checkLight("two noisy groups", 3, budgets, run(p, tab, with(light, atBudget(noisy0), atBudget(noisy1)), 8), without)
	checkFleet("two noisy groups", twoNoisy, budgets, without)

	// Two noisy groups of fleet.max each beside light load (0.25 ×
	// fleet.max): the over-budget packets take the capacity up the tiers,
	// where P bends.
	lightLow := []fleetStream{{member: 0, srcs: lightGroups(0, 5), rate: 100}, {member: 1, srcs: lightGroups(1, 5), rate: 100}, {member: 2, srcs: lightGroups(2, 3), rate: 50}}
	low0, low1 := fleetStream{0, noisy(0), 1000, span, 0}, fleetStream{1, noisy(1), 1000, span, 0}
	lowNoisy := with(lightLow, low0, low1)
	budgets, without = run(p, tab, lowNoisy, 6), run(plain, plainTab, lowNoisy, 7)
	checkLight("two noisy groups, light load low", 3, budgets, run(p, tab, with(lightLow, atBudget(low0), atBudget(low1)), 9), without)
	checkFleet("two noisy groups, light load low", lowNoisy, budgets, without)
}

// totalRate is the packets per window of streams.
func totalRate(streams []fleetStream) float64 {
	var r float64
	for _, s := range streams {
		r += s.rate
	}
	return r
}
