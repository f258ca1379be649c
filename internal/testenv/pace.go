package testenv

import (
	"testing"
	"time"
)

// Pacer paces a test's traffic loop against the wall clock in steps of
// 1 ms and records, for each window of the schedule, the longest the loop
// was away between two steps: a stall. On a busy machine (CI's has two
// CPUs) the loop can be descheduled for tens of milliseconds; it then
// offers the missed packets in one burst, which the limiter rightly judges
// as a surge. A window with such a burst, or the window after it (whose
// estimate the burst raised), does not measure what the test means to, so
// Judged leaves it out and says so in the log (STYLE.md: "Real time is
// noisy").
//
// Use:
//
//	pc := testenv.NewPacer(window, windows)
//	for el := pc.Now(); el < pc.Span(); el = pc.Now() {
//		k := int(el / window)
//		... offer what is due by el ...
//		pc.Sleep()
//	}
//	for k := range windows {
//		if !pc.Judged(t, k) {
//			continue
//		}
//		... judge window k on what it was really offered ...
//	}
type Pacer struct {
	begin   time.Time
	window  time.Duration
	windows int
	last    time.Duration
	stall   []time.Duration
	// Margin is the longest stall, as a fraction of the window, that a
	// window (and the one after it) is still judged with: 0.1 unless set.
	Margin float64
}

// NewPacer starts the clock of a schedule of windows windows of length
// window each.
func NewPacer(window time.Duration, windows int) *Pacer {
	return &Pacer{begin: time.Now(), window: window, windows: windows, stall: make([]time.Duration, windows), Margin: 0.1}
}

// Span is the schedule's length: windows × window.
func (p *Pacer) Span() time.Duration { return time.Duration(p.windows) * p.window }

// Now is the time since the schedule began. It records the time since the
// previous call as a stall of the window that call falls in, when it is
// the longest seen there.
func (p *Pacer) Now() time.Duration {
	el := time.Since(p.begin)
	if k := int(el / p.window); k >= 0 && k < p.windows {
		p.stall[k] = max(p.stall[k], el-p.last)
	}
	p.last = el
	return el
}

// Sleep sleeps to the next whole millisecond of the schedule.
func (p *Pacer) Sleep() {
	time.Sleep(time.Millisecond - time.Since(p.begin)%time.Millisecond)
}

// Stall is the longest gap between two steps of the loop in window k.
func (p *Pacer) Stall(k int) time.Duration { return p.stall[k] }

// Missed reports whether the loop stalled for more than Margin of a window
// in window k or in the window before it.
func (p *Pacer) Missed(k int) bool {
	limit := time.Duration(p.Margin * float64(p.window))
	if p.stall[k] > limit {
		return true
	}
	return k > 0 && p.stall[k-1] > limit
}

// Judged reports whether window k is to be judged, and logs the reason
// when it is not: the pacer missed its schedule there or in the window
// before it by more than Margin. It fails the test when more than half of
// the windows are left out, since then the machine was too busy for the
// test to mean anything; call it once per window, in order.
func (p *Pacer) Judged(tb testing.TB, k int) bool {
	tb.Helper()
	if !p.Missed(k) {
		return true
	}
	tb.Logf("window %d: not judged: the pacer stalled %v here and %v in the window before (more than %.0f%% of the %v window), so what it offered came in a burst",
		k, p.Stall(k).Round(time.Millisecond), p.stall[max(k-1, 0)].Round(time.Millisecond), 100*p.Margin, p.window)
	skipped := 0
	for i := 0; i <= k; i++ {
		if p.Missed(i) {
			skipped++
		}
	}
	if 2*skipped > p.windows {
		tb.Fatalf("the pacer missed its schedule in %d of %d windows: the machine was too busy for this test to judge anything", skipped, p.windows)
	}
	return false
}
