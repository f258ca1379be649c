package tiers

// SmoothProfN is how many samples of a window's in-budget count the
// smooth shape keeps with budgets on (SmoothProfile): one every
// SmoothProfStep ticks from the window's start.
const SmoothProfN = 16

// SmoothProfStep is the ticks between two samples of a window of ticks
// whole ticks: ⌈ticks/SmoothProfN⌉, at least 1, so that the samples
// cover the window.
func SmoothProfStep(ticks uint64) uint64 {
	return max((ticks+SmoothProfN-1)/SmoothProfN, 1)
}

// SmoothProfile is the profile of one window's in-budget count, which
// the next window's sliding count S reads with budgets on (docs/design.md
// §6): At[k] is the count (packets, the window's own, every CPU's) at the
// first refresh at or after tick k × SmoothProfStep of the window, Known
// how many of At are taken. The program keeps it in its smooth_prof map
// (bpf/smooth_prof.h), one per window id parity, taken by whichever CPU
// refreshes first in each step.
//
// Budgets front-load a window's in-budget packets: a group over its
// budget sends its budget's packets first and none after. The sliding
// count that spreads the previous window's count evenly over it, Prev ×
// (1 − f − gap/Ticks), then counts packets that came before the span it
// stands for: 64 groups at 1.56 × their budget, steady, were judged on
// S up to 1.3 × their in-budget count, and the window passed 0.85 ×
// P(R); 200 groups at 10 × their budget, 0.70 × P(R). The profile tells
// which of the previous window's packets came after the span's start.
type SmoothProfile struct {
	At    [SmoothProfN]uint64
	Known int
}

// Record takes the window's in-budget count n at a refresh elapsed ticks
// into a window of ticks whole ticks: each step from Known to the one
// elapsed is in falls gets n. A step that had no refresh had no packet
// (every CPU refreshes at its first packet of a tick), so its count is
// the next refresh's. Nothing is taken from the window's last tick on.
func (p *SmoothProfile) Record(elapsed, ticks, n uint64) {
	if elapsed >= ticks {
		return
	}
	k := min(int(elapsed/SmoothProfStep(ticks)), SmoothProfN-1)
	for ; p.Known <= k; p.Known++ {
		p.At[p.Known] = n
	}
}

// Base returns what the previous window, profiled in p with the final
// in-budget count prev, adds to the sliding count S of a window elapsed
// whole ticks in (its mid-tick, as SmoothState.Coef), gap ticks after the
// previous window's end: prev less its count at the span's start, e + ½
// + gap ticks into it, interpolated between the samples around it
// (prev after the last one taken). Without a profile (Known 0: no
// previous window, or one the program did not profile) it is the even
// spread, SmoothState.Coef's Base. Only integer arithmetic, as
// bpf/smooth_prof.h sm_prof_base does.
func (p SmoothProfile) Base(prev, elapsed, ticks, gap uint64) uint64 {
	j := max(ticks, 1)
	if p.Known == 0 {
		return SmoothState{Elapsed: elapsed, Ticks: j, Gap: gap, Prev: prev}.Coef().Base
	}
	d := SmoothProfStep(j)
	y := 2*min(elapsed, j) + 1 + 2*min(gap, j) // half-ticks into the previous window
	if y >= 2*j {
		return 0
	}
	k := y / (2 * d)
	at := func(i uint64) uint64 {
		if i >= SmoothProfN || i*d >= j || int(i) >= p.Known {
			return prev
		}
		return min(p.At[i], prev)
	}
	b0 := at(k)
	b1 := max(at(k+1), b0)
	span := min((k+1)*d, j) - k*d
	frac := (y - 2*k*d) << SmoothFracBits / (2 * span)
	return prev - b0 - mulShift(b1-b0, frac)
}
