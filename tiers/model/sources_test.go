package model

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/tierlimit/tierlimit/tiers"
)

func randomSeeds(r *rand.Rand) tiers.SketchSeeds {
	var s tiers.SketchSeeds
	for i := range s {
		for j := range s[i] {
			s[i][j] = r.Uint64()
		}
	}
	return s
}

func TestModelSources(t *testing.T) {
	p := tiers.Default()
	p.Shape = tiers.ShapeOrdinal
	p.Max = 1000
	p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 24, PrefixV6: 64}
	for _, mode := range []tiers.Mode{tiers.ModeEnforce, tiers.ModeDryRun, tiers.ModeOff} {
		p.Mode = mode
		m := NewModel(p, mustCompile(t, p), func() uint32 { return 0 })
		m.SetSketchSeeds(randomSeeds(rand.New(rand.NewPCG(9, 10))))
		a := netip.MustParseAddr("10.0.0.1")
		b := netip.MustParseAddr("10.0.0.200") // same /24 as a
		c := netip.MustParseAddr("10.0.1.1")
		for i := range 100 {
			src := a
			if i%2 == 1 {
				src = b
			}
			if d := m.PacketFrom(1, src); d.OverBudget || d.N != uint64(i+1) {
				t.Fatalf("%s: packet %d of the /24: %+v, want within budget", mode, i+1, d)
			}
		}
		// Over budget, it is judged at n + its rank among over-budget
		// packets (docs/design.md §6): 101, tier 0, so it passes.
		if d := m.PacketFrom(2, b); !d.OverBudget || d.N != 0 || d.Verdict != tiers.VerdictPass {
			t.Errorf("%s: 101st packet of the /24: %+v, want over budget, pass", mode, d)
		}
		if d := m.PacketFrom(3, c); d.OverBudget || d.N != 101 {
			t.Errorf("%s: another group: %+v, want counted as n 101", mode, d)
		}
		// 999 more over budget: ranks 2..1000, positions 103..1101; from
		// T_last = 1000 on (rank 899) every one is dropped.
		wantV := map[tiers.Mode]tiers.Verdict{tiers.ModeEnforce: tiers.VerdictDrop, tiers.ModeDryRun: tiers.VerdictWouldDrop, tiers.ModeOff: tiers.VerdictPass}[mode]
		for r := uint64(2); r <= 1000; r++ {
			d := m.PacketFrom(4, b)
			if !d.OverBudget || d.N != 0 {
				t.Fatalf("%s: rank %d: %+v, want over budget", mode, r, d)
			}
			if pos := 101 + r; pos >= 1000 && d.Verdict != wantV {
				t.Fatalf("%s: rank %d at position %d: %+v, want %s", mode, r, pos, d, wantV)
			}
		}
		// The next window restores the budget.
		if d := m.PacketFrom(2+uint64(p.Window), a); d.OverBudget || !d.WindowOpened || d.N != 1 {
			t.Errorf("%s: next window: %+v, want opened and within budget", mode, d)
		}
	}
}
