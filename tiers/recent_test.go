package tiers

import "testing"

// TestSmoothClockLive: a stream that never runs ahead of its schedule, one
// packet each ev from a phase after the latch, is read by SmoothClockLive
// at no more than its rate over a window (n − 1 packets need (n − 1) × ev
// at least), whatever the phase; SmoothClockRate, n over the time to the
// n-th, reads its first packet at window ÷ phase, up to 10⁴ × its rate
// here (docs/design.md §6, the light packets judged after a CPU's latch).
// The first packet reads 0.
func TestSmoothClockLive(t *testing.T) {
	const window, ev = uint64(1e9), uint64(8_500_000) // 118 a window
	rate := window / ev
	worstRate := uint64(0)
	for _, phase := range []uint64{1_000, 100_000, 1_000_000, 4_000_000, 8_499_999} {
		if got := SmoothClockLive(1, phase, window); got != 0 {
			t.Errorf("phase %d ns, the first packet: %d, want 0", phase, got)
		}
		for n := uint64(1); n <= 16; n++ {
			at := phase + (n-1)*ev
			if got := SmoothClockLive(n, at, window); got > rate+1 {
				t.Errorf("phase %d ns, packet %d at %d ns: %d a window, want at most the rate %d", phase, n, at, got, rate)
			}
			worstRate = max(worstRate, SmoothClockRate(n, at, window))
		}
	}
	if worstRate < 1000*rate {
		t.Errorf("SmoothClockRate read the stream at %d a window at most; the case expects its first packet's overshoot (≥ %d)", worstRate, 1000*rate)
	}
	// A surge, one packet each µs, is read at its rate within 1/n.
	for n := uint64(2); n <= 64; n *= 2 {
		got, want := SmoothClockLive(n, n*1_000, window), window/1_000
		if got > want || got < want-want/n-1 {
			t.Errorf("a surge at %d a window, packet %d: %d", want, n, got)
		}
	}
}
