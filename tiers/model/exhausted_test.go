package model

import (
	"math/rand/v2"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// noisyPolicy is the policy of agent's TestFairShedding, smooth: max 500
// per 1 s window, tiers at 70 % (drop 20 %), 80 % (50 %) and 100 % (all),
// a budget of 10 % (50 packets) per source.
func noisyPolicy() tiers.Policy {
	p := tiers.Default()
	p.Shape = tiers.ShapeSmooth
	p.Mode = tiers.ModeEnforce
	p.Window = time.Second
	p.Max = 500
	p.Tiers = []tiers.Tier{{At: tiers.Pct(70), Drop: tiers.Pct(20)}, {At: tiers.Pct(80), Drop: tiers.Pct(50)}, {At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
	return p
}

// noisyRun is one first window of TestFairShedding's traffic in the model:
// from idle, source A sends flood datagrams and each of light sources
// B–K sends lightN, all evenly paced over 850 ms, A from phase 0 and each
// light source from its own phase (ns, below its interval). It returns
// the light sources' losses in the window: judged before A spent its
// budget (early) and after (late).
func noisyRun(t *testing.T, tab tiers.Table, seed, tick uint64, flood, lightN int, phases []uint64) (early, late int) {
	t.Helper()
	p := noisyPolicy()
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	m := NewModel(p, tab, r.Uint32)
	m.SetTick(tick)
	m.SetSketchSeeds(randomSeeds(r))
	type pkt struct {
		at  uint64
		src int
	}
	const spread = 850_000_000
	start := uint64(1e9) + r.Uint64N(tick)
	var pkts []pkt
	for i := range flood {
		pkts = append(pkts, pkt{start + uint64(i)*spread/uint64(flood), 0})
	}
	for s, ph := range phases {
		for i := range lightN {
			pkts = append(pkts, pkt{start + ph + uint64(i)*spread/uint64(lightN), 1 + s})
		}
	}
	sort.SliceStable(pkts, func(i, j int) bool { return pkts[i].at < pkts[j].at })
	for _, k := range pkts {
		src := netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + k.src)})
		spent := m.exhIn > 0
		d := m.PacketFrom(k.at, src)
		switch {
		case k.src == 0 || d.Verdict == tiers.VerdictPass:
		case spent:
			late++
		default:
			early++
		}
	}
	return early, late
}

// docs/design.md §6, "light groups lose nothing to a noisy one", in the
// first window of a flood, smooth shape: TestFairShedding's traffic (one
// group at 10 × max, ten light groups of 4 % of max each) over 100 seeds
// and tick phases, under HZ 250 and 1000 and the clock's tick, with the
// light sources at random phases and in step (as the agent test's
// senders, which start together).
//
// At random phases, once the flood has spent its budget (its first 50
// packets, 8.5 ms), no light packet is lost: its budget is counted as it
// is and not extrapolated (Sketch.OverSpent, inEstimate). Before that,
// the flood is a surge of in-budget packets like any other (property 3
// sheds such a surge from its first ticks): the light packets judged in
// those milliseconds may be shed, 0.83 per window in the mean here; the
// bound is 5σ over that.
//
// In step, the ten light sources' datagrams come in bursts of ten, every
// 42.5 ms: in an onset window's first ticks a burst just counted doubles
// the light groups' extrapolated rate (20 packets in 42.5 ms read as 470
// per window, past T_1 with the flood's 50), which sheds a few light
// packets per hundred windows after the flood's budget is spent too
// (0.24 per window without the flood at all, 0.56 with it); the bound
// is 5σ over that.
//
// Before the exhausted budgets were kept out of the extrapolation, 12 to
// 16 light packets were lost per window (in all 100 runs), most of them
// after the flood's budget was spent.
func TestSmoothNoisyGroupLightLoseNothing(t *testing.T) {
	tab := mustCompile(t, noisyPolicy())
	const runs = 100
	for _, tick := range []uint64{hz250, 1_000_000, 1 << tiers.SmoothTickShift} {
		for _, inStep := range []bool{true, false} {
			early, late := 0, 0
			for seed := range uint64(runs) {
				r := rand.New(rand.NewPCG(seed, 7))
				phases := make([]uint64, 10)
				for i := range phases {
					if inStep {
						phases[i] = r.Uint64N(1_000_000) // goroutines started together
					} else {
						phases[i] = r.Uint64N(42_500_000)
					}
				}
				e, l := noisyRun(t, tab, seed, tick, 5000, 20, phases)
				early += e
				late += l
			}
			t.Logf("tick %d ns, in step %v: light lost %d of %d before the flood spent its budget, %d after", tick, inStep, early, runs*200, late)
			if inStep {
				if early+late > 100 {
					t.Errorf("tick %d ns, in step: the light sources lost %d datagrams in window 0 (%d runs), want at most 100", tick, early+late, runs)
				}
				continue
			}
			if late > 0 {
				t.Errorf("tick %d ns: the light sources lost %d datagrams in window 0 after the flood spent its budget (%d runs), want 0", tick, late, runs)
			}
			if early > 130 {
				t.Errorf("tick %d ns: the light sources lost %d datagrams before the flood spent its budget (%d runs), want at most 130", tick, early, runs)
			}
		}
	}
}
