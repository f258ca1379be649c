package model

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// TestLicenseDayFlood runs a license day through the model, compressed
// to 2,000 windows of one second, flooded at 2× the day's average rate
// with 1 % of the datagrams protected (severity 2, §7): the pacing law
// (tiers.License.Pace, docs/design.md §13), fed each window what the
// agent reads (the day's passes, the last window's offered count, the
// protected peak), ends the day within 1 % of per_day, and every
// protected datagram passes, and the spend follows the pacing line
// (half at mid-day). The policy counts bytes, and each datagram
// here is one byte of the license (the model counts datagrams; the law
// is the same whatever the unit: the budget is a max, the units its),
// through tiers.Effective as the agent applies it.
func TestLicenseDayFlood(t *testing.T) {
	for _, shape := range []tiers.Shape{tiers.ShapeSmooth, tiers.ShapeOrdinal} {
		t.Run(shape.String(), func(t *testing.T) { licenseDay(t, shape, 2) })
	}
	t.Run("half", func(t *testing.T) { licenseDay(t, tiers.ShapeSmooth, 0.5) })
}

func licenseDay(t *testing.T, shape tiers.Shape, rate float64) {
	const (
		windows = 2000
		avg     = 500 // units per window, the day's average
	)
	p := tiers.Default()
	p.Shape = shape
	p.Severity = &tiers.Severity{Protect: []int{0, 1, 2}, ProtectBudget: tiers.Pct(5)}
	l := &tiers.License{PerDay: windows * avg, WarnAt: tiers.Pct(80)}
	p.Count, p.License, p.Max = tiers.CountBytes, l, 1<<30 // the license governs: Effective takes its max
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	day := tiers.LicenseDay{Start: start, End: start.Add(windows * time.Second)}
	rng := rand.New(rand.NewPCG(1, 2))
	offeredPerWindow := int(rate * avg)
	var m *Model
	var mid uint64 // the spend at mid-day
	var spent, offered, protectedPeak, protSeen, protPassed uint64
	for w := range windows {
		if w == windows/2 {
			mid = spent
		}
		now := start.Add(time.Duration(w) * time.Second)
		pc := l.Pace(tiers.PaceInput{Day: day, Now: now, Window: p.Window, Spent: spent, Offered: offered,
			Protected: protectedPeak, Tiers: p.Tiers, ProtectBudget: p.Severity.ProtectBudget})
		q, _ := tiers.Effective(p, tiers.State{LicenseMax: pc.Max})
		tab, err := tiers.Compile(q, 0)
		if err != nil {
			t.Fatal(err)
		}
		if w == 0 {
			m = NewModel(q, tab, rng.Uint32)
		} else {
			m.Apply(tab)
		}
		var prot uint64
		base := uint64(w) * uint64(time.Second)
		for i := range offeredPerWindow {
			sev := 6
			if rng.IntN(100) == 0 {
				sev, prot = 2, prot+1
			}
			d := m.PacketSeverity(base+uint64(i)*uint64(time.Second)/uint64(offeredPerWindow), sev)
			if d.Verdict == tiers.VerdictPass {
				spent++
				if sev == 2 {
					protPassed++
				}
			}
		}
		protSeen += prot
		offered, protectedPeak = uint64(offeredPerWindow), max(protectedPeak*7/8, prot)
	}
	dev := (float64(spent) - float64(l.PerDay)) / float64(l.PerDay)
	t.Logf("%s at %.1fx: passed %d of per_day %d (%+.3f%%); protected %d of %d passed", shape, rate, spent, l.PerDay, 100*dev, protPassed, protSeen)
	if rate >= 1 && (dev < -0.01 || dev > 0.01) {
		t.Errorf("the day ended %+.3f%% from per_day, want within 1%%", 100*dev)
	}
	// The spend follows the pacing line: at mid-day half the day's
	// volume (the law's correction for the tiers' pass curve; with the
	// integral correction alone it would be 46 %).
	if m := float64(mid) / float64(l.PerDay); rate >= 1 && (m < 0.49 || m > 0.51) {
		t.Errorf("at mid-day %.2f%% of per_day was spent, want 50 ± 1 %%", 100*m)
	}
	if rate < 1 && spent != uint64(offeredPerWindow)*windows {
		t.Errorf("at %.1fx the day passed %d of %d offered, want all", rate, spent, offeredPerWindow*windows)
	}
	if protPassed != protSeen {
		t.Errorf("protected: %d of %d passed, want all", protPassed, protSeen)
	}
}
