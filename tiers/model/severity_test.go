package model

import (
	"testing"

	"github.com/tierlimit/tierlimit/tiers"
)

// The model: a forged protected flood passes at most the budget over the
// tiers; protection only moves passes between classes when the debt is
// paid off.
func TestModelSeverity(t *testing.T) {
	p := tiers.Default()
	p.Shape = tiers.ShapeOrdinal
	p.Max = 1000
	p.Tiers = []tiers.Tier{{At: tiers.Pct(50), Drop: tiers.Pct(100)}, {At: tiers.Pct(80), Drop: tiers.Pct(0)}, {At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	p.Severity = &tiers.Severity{Protect: []int{2}, ProtectBudget: tiers.Pct(5)}
	tab, _ := tiers.Compile(p, 0)
	m := NewModel(p, tab, nil)
	protected, paid := 0, 0
	for i := uint64(1); i <= 2000; i++ {
		sev := 6 // info
		if i%2 == 0 {
			sev = 2 // crit
		}
		d := m.PacketSeverity(i, sev)
		if d.Protected {
			protected++
		}
		if d.Paid {
			paid++
		}
		if m.Debt() > 50 {
			t.Fatalf("packet %d: debt %d over the budget", i, m.Debt())
		}
	}
	// Tier 1 (500..799): 150 crit drop verdicts, 50 protected; tier 2
	// (800..999): 100 info passes, 50 pay; tier 3: 500 crit, 50 protected.
	if protected != 100 || paid != 50 || m.Debt() != 50 {
		t.Fatalf("protected %d, paid %d, debt %d; want 100, 50, 50", protected, paid, m.Debt())
	}
	// A new window clears the debt.
	m.PacketSeverity(1e12, 6)
	if m.Debt() != 0 {
		t.Fatalf("debt %d after a new window", m.Debt())
	}
}
