package bpf_test

import (
	"math"
	"testing"
	"time"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// smoothRun paces frames through the program at rate packets per window
// for windows windows (1 ms batches, BPF_PROG_TEST_RUN) and returns each
// window's passes by tenth, windows told apart by the program's own window
// id, as DESIGN.md §9's properties count them.
func smoothRun(t *testing.T, h *harness, frame []byte, window time.Duration, rate float64, windows int) [][10]int {
	t.Helper()
	per := rate / float64(window/time.Millisecond)
	start := time.Now()
	first := h.window().Opened + 1
	var out [][10]int
	var credit float64
	for time.Since(start) < time.Duration(windows)*window {
		credit += per
		passed := 0
		for ; credit >= 1; credit-- {
			if h.run(frame) == xdpPass {
				passed++
			}
		}
		// One window read per 1 ms batch: the batch's passes go to the
		// window and tenth its last packet was in.
		w := h.window()
		if i := int(w.Opened) - int(first); i >= 0 {
			for len(out) <= i {
				out = append(out, [10]int{})
			}
			el := time.Duration(monotonicNow(t) - w.StartNs)
			out[i][min(int(el*10/window), 9)] += passed
		}
		time.Sleep(time.Millisecond - time.Since(start)%time.Millisecond)
	}
	return out
}

// The program's smooth shape against the model's expectation, in real
// time: a steady flood at 10 × max passes P(R) per window within 5 sigma
// from the second window on (property 1), and the flood's first window
// from idle passes at most 1.1 × P(R) with no tenth over 0.25 × max
// (property 3); the ordinal shape, run the same way, passes its budget in
// the first tenth. Windows of 500 ms keep the test short.
func TestSmoothProgram(t *testing.T) {
	const window = 500 * time.Millisecond
	for _, shape := range []tiers.Shape{tiers.ShapeSmooth, tiers.ShapeOrdinal} {
		t.Run(shape.String(), func(t *testing.T) {
			p := ordinalDefault()
			p.Shape = shape
			p.Window, p.Max = window, 300
			h := newHarness(t, p)
			h.expire()
			tab := mustCompile(t, p)
			R := 10 * float64(p.Max)
			out := smoothRun(t, h, UDP4(t, 514), window, R, 5)
			if len(out) < 4 {
				t.Fatalf("%d windows", len(out))
			}
			pr := tab.Expected(uint64(R)).Passed
			sum := func(a [10]int) (s int) {
				for _, v := range a {
					s += v
				}
				return s
			}
			most := 0
			for _, v := range out[0] {
				most = max(most, v)
			}
			first := float64(sum(out[0]))
			t.Logf("%s: first window passed %.0f (%.2f × P(R) %.0f), largest tenth %d; by tenth %v", shape, first, first/pr, pr, most, out[0])
			// The model holds the first window to 1.1 × P(R) exactly
			// (tiers TestSmoothOnset); paced in real time on a shared
			// machine the offered rate jitters, so the program is held to
			// 1.25 × and to the spreading: no tenth over 0.25 × max.
			onset := first <= 1.25*pr && float64(most) <= 0.25*float64(p.Max)
			if shape == tiers.ShapeOrdinal {
				if onset {
					t.Errorf("ordinal passes its window's budget spread out: %v", out[0])
				}
				return
			}
			if !onset {
				t.Errorf("onset: first window passed %.0f (want ≤ %.0f), largest tenth %d (want ≤ %.0f)", first, 1.25*pr, most, 0.25*float64(p.Max))
			}
			for i := 1; i < len(out)-1; i++ {
				got := float64(sum(out[i]))
				// The windows' offered counts vary with the pacing: judge
				// each against 5 sigma of a binomial at R/4 plus 10%.
				sigma := math.Sqrt(R / 4)
				t.Logf("window %d: passed %.0f by tenth %v", i, got, out[i])
				if math.Abs(got-pr) > 5*sigma+0.1*pr {
					t.Errorf("window %d: passed %.0f, want %.0f ± (5 × %.1f + 10%%)", i, got, pr, sigma)
				}
			}
		})
	}
}
