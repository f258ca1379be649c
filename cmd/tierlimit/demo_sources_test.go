package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// TestDemoNoisySource runs `tierlimit demo --noisy-source` in both shapes:
// three policies side by side, two windows each. Without budgets the light
// senders lose most of theirs; with budgets they lose nothing and the noisy
// sender gets what they leave, well over its budget; alone (the relay) it
// gets what the tiers give, near P(R), not its budget; the collector's
// total with budgets stays near the total without. The second window is
// steady (the demo sends each window over exactly one window, back to
// back): there each case's total is P(R) within 5σ (TestDemoSteady).
func TestDemoNoisySource(t *testing.T) {
	const budget = 100 // 10% of max 1000
	for _, shape := range []string{"smooth", "ordinal"} {
		out, _ := demoCLI(t, "--noisy-source", "--shape", shape, "--max", "1000", "--window", "500ms")
		// A sender the scheduler delays is cut at the window's end, so
		// what was sent is read, not assumed.
		// rows[window][label] are the label's sent, passed and expect in
		// each of the three cases: no budgets, budgets, noisy alone.
		rows := map[int]map[string][3][3]float64{}
		window := 0
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "window" {
				window, _ = strconv.Atoi(f[1])
				rows[window] = map[string][3][3]float64{}
				continue
			}
			if len(f) < 12 || (f[0] != "198.51.100.10" && f[0] != "light" && f[0] != "total") {
				continue
			}
			var r [3][3]float64
			for c := range 3 {
				for k := range 3 {
					r[c][k], _ = strconv.ParseFloat(f[2+4*c+k], 64)
				}
			}
			rows[window][f[0]] = r
		}
		if len(rows) != 2 {
			t.Fatalf("%s: want 2 windows:\n%s", shape, out)
		}
		for w := 1; w <= 2; w++ {
			noisy, light, total := rows[w]["198.51.100.10"], rows[w]["light"], rows[w]["total"]
			const none, budgets, alone = 0, 1, 2
			const sent, passed, expect = 0, 1, 2
			if light[none][sent] == 0 || 2*light[none][passed] > light[none][sent] {
				t.Errorf("%s window %d, no budgets: light senders passed %v of %v, want most shed", shape, w, light[none][passed], light[none][sent])
			}
			// docs/design.md §6: light groups lose nothing once the noisy
			// one has spent its budget. In the smooth shape's onset window
			// (window 1, from idle) the flood's first budget packets are a
			// surge within budget like any other, and light packets judged
			// in those first milliseconds may be shed: at most
			// onsetLightLoss of theirs.
			lost := light[budgets][sent] - light[budgets][passed]
			if allowed := onsetLightLossAllowed(shape, w == 1, light[budgets][sent], noisy[budgets][sent], budget); light[budgets][sent] == 0 || lost > allowed {
				t.Errorf("%s window %d, budgets: light senders passed %v of %v, want all (at most %v lost)", shape, w, light[budgets][passed], light[budgets][sent], allowed)
			}
			if noisy[budgets][passed] <= 2*budget {
				t.Errorf("%s window %d, budgets: the noisy sender passed %v, want what the light ones leave, over twice its budget %d (expect %v)",
					shape, w, noisy[budgets][passed], budget, noisy[budgets][expect])
			}
			if light[alone][sent] != 0 || noisy[alone][passed] < 0.6*noisy[alone][expect] || noisy[alone][passed] > 2*noisy[alone][expect] {
				t.Errorf("%s window %d, noisy alone: passed %v, want near P(R) = %v, far over its budget %d", shape, w, noisy[alone][passed], noisy[alone][expect], budget)
			}
			// Each case offers the same load; a case whose sender the
			// scheduler delayed (sent short of the most any case sent by
			// more than 5 %) started its windows late, so its second
			// window straddles two of the limiter's: it is not the steady
			// window the bound is about, and is left out, said in the log.
			offered := max(total[none][sent], total[budgets][sent], noisy[alone][sent])
			for c, name := range []string{"no budgets", "budgets", "noisy alone"} {
				r := total
				if c == alone {
					r = noisy
				}
				if w == 2 && r[c][sent] < 0.95*offered {
					t.Logf("%s window %d, %s: the sender fell behind (sent %v of %v): not judged as a steady window", shape, w, name, r[c][sent], offered)
					continue
				}
				q := r[c][expect] / r[c][sent]
				if sigma := math.Sqrt(r[c][sent] * q * (1 - q)); w == 2 && math.Abs(r[c][passed]-r[c][expect]) > 5*sigma {
					t.Errorf("%s window %d, %s: the collector received %v of %v, want P(R) = %v ± %.0f (5σ)", shape, w, name, r[c][passed], r[c][sent], r[c][expect], 5*sigma)
				}
			}
			if total[budgets][passed] < 0.6*total[none][expect] || total[budgets][passed] > 2*total[none][expect] {
				t.Errorf("%s window %d: the collector's total with budgets %v, without %v (P(R) = %v)", shape, w, total[budgets][passed], total[none][passed], total[none][expect])
			}
		}
	}
}

// onsetLightLoss is the share of the light groups' packets that the smooth
// shape may shed in a flood's onset window with budgets on (docs/design.md
// §6): those judged before the noisy group has spent its budget, a
// surge within budget until then. The noisy sender spends its budget in
// the first 1 % of the window here; the rest is the onset estimate's
// reading of light senders that send in step (docs/design.md §9). §6
// bounds it at 5 % over a run of onsets and 10 % in one window: under the
// onset from the recent rate (issue 39) the light packets judged in the
// flood's first milliseconds are judged at its rate, and one window of
// 200 light packets lost 11 (5.5 %) in CI.
const onsetLightLoss = 0.10

// onsetLightLossAllowed is how many of sent light packets a window may
// lose: none in the ordinal shape; in the smooth shape's onset window
// onsetLightLoss; in every later smooth window, those judged while the
// noisy group (noisySent in the window) spends its budget anew at the
// window's start, a surge within budget after its pause (docs/design.md
// §6): sent × budget / noisySent in expectation (2 of 200 here), bounded
// at 5σ over it (Poisson). Measured on AMD EPYC (2026-12-03), before and
// after the judgement's tail call alike: 1 or 2 of 200 lost in window 2 in
// 4 of 9 runs, none in the others.
func onsetLightLossAllowed(shape string, onset bool, sent, noisySent, budget float64) float64 {
	switch {
	case shape != "smooth":
		return 0
	case onset:
		return math.Floor(onsetLightLoss * sent)
	case noisySent <= budget:
		return 0
	}
	m := sent * budget / noisySent
	return math.Floor(m + 5*math.Sqrt(m))
}
