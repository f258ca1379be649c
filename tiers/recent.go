package tiers

// The smooth shape's onset from the recent rate (docs/design.md §9, issue
// 39): each CPU measures the rate of the window's count over its last
// ticks, projects it over a whole window (E, the rate × the window, never
// the count so far plus the rate over the rest), latches an onset once E
// passes 5/4 of the sliding count S (and, latched already, twice the E it
// latched at), judges at max(S, E) while latched, and releases once E
// falls to S. The program holds the same rule
// (bpf/smooth.h sm_recent, sm_latch); model.Model is the reference.
const (
	// SmoothLatchShift sets the onset's margin: E must pass S + S >>
	// SmoothLatchShift (5/4 of S) to latch. A step from b to s is an
	// onset when s/b is more than 5/4: a step short of it that is judged
	// on S alone passes at most (θ/(θ−1))·ln θ = 1.116 × P(R_after) over
	// its first window with θ = 5/4, where P is flat.
	SmoothLatchShift = 2
	// SmoothClockBits is the fixed-point scale of the part of a window
	// SmoothClockRate reads from the clock: 2^-24 of a window (215 µs of
	// an hour's), where SmoothFracBits' 2^-16 would be 55 ms.
	SmoothClockBits = 24
)

// SmoothRecentMult is the multiplier that projects the count since the
// reference, dt whole ticks before this tick, over a window of ticks
// ticks: the count is taken over dt + ½ ticks (the reference was taken at
// the first packet of its tick), so E = count × 2·ticks/(2·dt + 1), with
// SmoothFracBits fractional bits (bpf/smooth.h sm_refresh's k_rate).
func SmoothRecentMult(ticks, dt uint64) uint64 {
	j := max(ticks, 1)
	return (2 * j) << SmoothFracBits / (2*dt + 1)
}

// SmoothClockRate is E from the clock: the count since the origin (the
// window's start, or the latch) over the part of a window elapsed since
// it, elNs of windowNs, read per packet in the first SmoothClockTicks
// ticks after the origin, where whole ticks are furthest off. The part
// has SmoothClockBits fractional bits and is at least 2^-SmoothClockBits
// of the window: no floor of 1/32 (which passed 1.24 × P(R) in a flood's
// first window at 10³ × max). elNs is below 2^38 (16 ticks).
func SmoothClockRate(count, elNs, windowNs uint64) uint64 {
	f := max(elNs<<SmoothClockBits/max(windowNs, 1), 1)
	return count << SmoothClockBits / f
}

// SmoothClockLive is the live in-budget rate over a window read from the
// clock after a latch: SmoothClockRate of count − 1, count the in-budget
// packets of groups within their budget since the latch (this one
// included). count over the time since the latch is the inverse of one
// gap when count is 1 or 2 (a light group's packet 100 µs after another
// CPU's latch read as 10⁴ a window, and light groups lost up to 10 % of
// a window's packets, docs/design.md §6); count − 1 is the rate's
// unbiased estimate from a Poisson stream's arrivals (n − 1 over the time
// to the n-th), 0 on the first packet, and within 1/count of count's once
// the surge it measures has a few packets.
func SmoothClockLive(count, elNs, windowNs uint64) uint64 {
	if count < 2 {
		return 0
	}
	return SmoothClockRate(count-1, elNs, windowNs)
}

// SmoothLatches reports whether a CPU not latched latches an onset: at
// least SmoothOnsetMin packets since the reference (count), and the
// rate E over them projected over a window past 5/4 of the sliding count
// s.
func SmoothLatches(count, e, s uint64) bool {
	return SmoothLatchesFrom(count, SmoothOnsetMin, e, s)
}

// SmoothLatchesFrom is SmoothLatches with least, not SmoothOnsetMin,
// packets since the reference: a fleet member's FleetLatchMin.
func SmoothLatchesFrom(count, least, e, s uint64) bool {
	return count >= least && e > s+s>>SmoothLatchShift
}

// SmoothReleases reports whether a latched CPU releases its onset: at
// least SmoothOnsetMin packets since the reference and E no more than the
// sliding count s (S has caught up with the rate, docs/design.md §9
// property 4).
func SmoothReleases(count, e, s uint64) bool {
	return SmoothReleasesFrom(count, SmoothOnsetMin, e, s)
}

// SmoothReleasesFrom is SmoothReleases with least, not SmoothOnsetMin,
// packets since the reference: a fleet member's FleetLatchMin, so that a
// latch on the noise of a member's light share (a few packets) releases
// as soon as it latched, and a flood after it latches afresh, its rate
// read from the clock from the step (docs/design.md §12).
func SmoothReleasesFrom(count, least, e, s uint64) bool {
	return count >= least && e <= s
}
