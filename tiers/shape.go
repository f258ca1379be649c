package tiers

import (
	"fmt"
	"math"
	"math/bits"
)

// Shape says how the limiter spreads a window's passes over the window
// (docs/design.md §9). Both shapes use the same tier table and pass P(R) =
// Table.Expected(R).Passed of a window offered R packets, in expectation.
type Shape uint8

const (
	// ShapeOrdinal is the seed's rule (docs/design.md §2): the n-th selected
	// packet of a window is judged at its tier's drop rate, so under a
	// flood every pass of a window arrives in a burst at the window's
	// start. It is the zero value, so a Policy built in Go keeps the
	// seed's rule unless it says otherwise; Parse defaults to ShapeSmooth.
	ShapeOrdinal Shape = iota
	// ShapeSmooth drops each selected packet with probability q(R̂) =
	// 1 − P(R̂)/R̂, where R̂ is the running estimate of the window's
	// offered count (SmoothEstimator), so the passes are spread over the
	// window at the rate the tiers allow. The default of a parsed policy.
	ShapeSmooth
)

// String returns "ordinal" or "smooth".
func (s Shape) String() string {
	switch s {
	case ShapeOrdinal:
		return "ordinal"
	case ShapeSmooth:
		return "smooth"
	}
	return fmt.Sprintf("shape(%d)", uint8(s))
}

// ParseShape parses "smooth" or "ordinal". Returns ErrShape otherwise.
func ParseShape(s string) (Shape, error) {
	switch s {
	case "smooth":
		return ShapeSmooth, nil
	case "ordinal":
		return ShapeOrdinal, nil
	}
	return 0, fmt.Errorf("%w %q: want smooth or ordinal", ErrShape, s)
}

// The smooth estimator's constants (docs/design.md §9), shared with the XDP
// program (bpf/consts.h; bpf's contract test compares them). Fractions of a
// window are fixed point with SmoothFracBits fractional bits.
const (
	// SmoothFracBits is the fixed-point scale of a window fraction: 1.0 is
	// 1 << SmoothFracBits.
	SmoothFracBits = 16
	// SmoothMinFrac is the least elapsed fraction the rate extrapolation
	// divides by (1/32 of a window): before it, n packets are read as at
	// most 32 n per window, which bounds the estimate's noise early in a
	// window.
	SmoothMinFrac = 1 << SmoothFracBits / 32
	// SmoothOnsetMin is the least count at which a window can be latched
	// as an onset (SmoothEstimator): fewer packets say too little about a
	// rate.
	SmoothOnsetMin = 16
	// SmoothClockTicks is how many ticks from a window's start an onset
	// reads F from the clock per packet (SmoothOnsetF): where the
	// elapsed part of the window counted in whole ticks is furthest off,
	// and nowhere else, so that a flood pays the clock for 16 ticks at
	// most (64 ms at HZ 250), not its whole first window.
	SmoothClockTicks = 16
	// SmoothTickShift is the tick of the estimate when the program has no
	// jiffies gate (window_jiffies 0): the clock in ns >> 22, 4.19 ms.
	SmoothTickShift = 22
)

// SmoothState is what the estimate of one window is made of, as the program
// holds it when it refreshes its per-CPU estimate at a new tick.
type SmoothState struct {
	// Elapsed is the whole ticks since the window opened (0 in its first
	// tick), Ticks the whole ticks in a window (at least 1).
	Elapsed, Ticks uint64
	// Gap is the whole ticks between the end of the previous window (its
	// start plus Ticks) and the start of this one: 0 when they abut.
	Gap uint64
	// Prev is the previous window's final count, packets; 0 when there was
	// none.
	Prev uint64
}

// SmoothCoef is the per-tick part of the estimate: what the program keeps
// per CPU and applies to each packet's live count n with two
// multiplications (SmoothCoef.Estimate).
type SmoothCoef struct {
	// Base is the previous window's share of the last window's span:
	// Prev × (1 − f − gap/Ticks)⁺, packets, with f the elapsed fraction
	// ((Elapsed + ½)/Ticks, at most 1).
	Base uint64
	// Mult is the rate extrapolation's multiplier, 1/max(f, SmoothMinFrac)
	// with SmoothFracBits fractional bits.
	Mult uint64
	// Prev is the previous window's count as this window's expectation:
	// Prev × (1 − gap/Ticks)⁺, packets.
	Prev uint64
}

// Coef computes the per-tick coefficients of a window in state st. Only
// integer arithmetic, as the program does.
func (st SmoothState) Coef() SmoothCoef {
	j := max(st.Ticks, 1)
	e := min(st.Elapsed, j)
	f := min((2*e+1)<<(SmoothFracBits-1)/j, 1<<SmoothFracBits)
	g := min(st.Gap, j) << SmoothFracBits / j
	var c SmoothCoef
	if ov := int64(1<<SmoothFracBits) - int64(f) - int64(g); ov > 0 {
		c.Base = mulShift(st.Prev, uint64(ov))
	}
	c.Prev = mulShift(st.Prev, 1<<SmoothFracBits-g)
	c.Mult = 1 << (2 * SmoothFracBits) / max(f, SmoothMinFrac)
	return c
}

// SmoothRateRef moves the reference of the in-budget count's recent rate
// (docs/design.md §6, §9 property 3, with budgets on) at a refresh at tick with
// the window's in-budget count n: once the candidate sample is D =
// max(Ticks/16, 1) ticks old it becomes the reference, and (tick, n) the
// candidate. A window starts with both at (its start tick, 0), so the rate
// is the rate since the window opened for its first D ticks, then over the
// last D to 2D ticks. Returns the new reference and candidate.
func SmoothRateRef(ticks, tick, n, refTick, refN, candTick, candN uint64) (uint64, uint64, uint64, uint64) {
	if tick >= candTick+max(ticks/16, 1) {
		refTick, refN, candTick, candN = candTick, candN, tick, n
	}
	return refTick, refN, candTick, candN
}

// RateMult is the multiplier that extrapolates the in-budget count by its
// recent rate: the packets since the reference, dt ticks before this tick,
// counted over dt + ½ ticks, are expected again in each such span of the
// rest of the window (Ticks − Elapsed − ½ ticks), SmoothFracBits
// fractional bits. With the reference at the window's start (dt ≥
// Elapsed) it is mult − 1 (SmoothCoef.Mult), so that the in-budget
// estimate n + n × RateMult is F, held to 32 n early in the window.
func (st SmoothState) RateMult(dt, mult uint64) uint64 {
	j := max(st.Ticks, 1)
	e := min(st.Elapsed, j)
	switch {
	case e >= j:
		return 0
	case dt >= e:
		return mult - 1<<SmoothFracBits
	}
	return (2*(j-e) - 1) << SmoothFracBits / (2*dt + 1)
}

// mulShift is x × y >> SmoothFracBits without overflow for any x below
// 2^48.
func mulShift(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi<<(64-SmoothFracBits) | lo>>SmoothFracBits
}

// Sliding returns S = n + Base: the count over the last window's span
// (a sliding window: the current window's n plus the previous window's
// share).
func (c SmoothCoef) Sliding(n uint64) uint64 { return n + c.Base }

// Onset reports whether a window whose live count is n is an onset: F =
// n × Mult, the count extrapolated to the window's end, is over twice the
// sliding count S, with n ≥ SmoothOnsetMin (the rate more than doubled
// since the last window's span). The program latches it for the rest of
// the window.
func (c SmoothCoef) Onset(n uint64) bool {
	return n >= SmoothOnsetMin && mulShift(n, c.Mult) > 2*c.Sliding(n)
}

// FleetOnset reports whether a fleet member's window whose live count n
// is below SmoothOnsetMin is an onset on the fleet's count (docs/design.md
// §12, "The fleet's first second"): n × members, members the fleet's
// count at the last answer, is at least SmoothOnsetMin, and F is over
// twice S as in Onset. A flood that reaches every member at once reaches
// each at 1/members of its rate, and the fleet has seen SmoothOnsetMin
// packets when each member has seen SmoothOnsetMin/members.
func (c SmoothCoef) FleetOnset(n, members uint64) bool {
	return members > 1 && n > 0 && n < SmoothOnsetMin && n*members >= SmoothOnsetMin &&
		mulShift(n, c.Mult) > 2*c.Sliding(n)
}

// Estimate returns R̂, the estimate of the window's offered count for a
// packet whose live count (this packet included) is n, in a window that
// is an onset or not: max(S, F) in an onset, S otherwise (Sliding, Onset).
//
// Under a steady rate S is the rate's count per window from the second
// window on (docs/design.md §9 property 1), and F's noise never moves R̂. From
// idle to a flood F reaches the flood's rate within 1/32 of the window
// (property 3). When a flood ends S sheds its share within one window
// (property 4).
func (c SmoothCoef) Estimate(n uint64, onset bool) uint64 {
	s := c.Sliding(n)
	if f := mulShift(n, c.Mult); onset && f > s {
		return f
	}
	return s
}

// SmoothOnsetF is F in an onset without budgets, per packet: n over the
// window's elapsed fraction elapsedNs / windowNs (at least SmoothMinFrac,
// at most 1), SmoothFracBits fractional bits, as the program computes it
// from bpf_ktime_get_ns in a window latched as an onset (smooth.h
// sm_onset_f). The per-tick F (SmoothCoef.Estimate) counts the elapsed
// fraction in whole ticks, which a window of a few ticks reads off by up
// to half a tick at each packet: 1.16 × P(R) in the onset's first window
// at 20 ticks (200 ms at HZ 100), 1.06 from the clock. Only the first
// SmoothClockTicks ticks of an onset window pay the clock and two divisions
// per packet.
func SmoothOnsetF(n, elapsedNs, windowNs uint64) uint64 {
	f := min(max(elapsedNs<<SmoothFracBits/max(windowNs, 1), SmoothMinFrac), 1<<SmoothFracBits)
	return n << SmoothFracBits / f
}

// SmoothTable is the smooth shape's part of a compiled policy: q(R̂) on
// the bpf_get_prandom_u32 scale, indexed like Table (entry R̂ >> Shift,
// Table.Tiers giving the tier of R̂), and the closed form beyond the
// table.
type SmoothTable struct {
	// Thresholds[i] is round(q(i << Shift) × 2^32): 0 while the tiers
	// drop nothing up to i << Shift (no drop at all below T_1),
	// AlwaysDrop when they pass nothing.
	Thresholds []uint32
	// ShedDrops[k] is the threshold of a shed-first datagram whose R̂ is in
	// tier k: q at the first R̂ of tier k+1 (0 in tier 0; AlwaysDrop in
	// the last tier), docs/design.md §7 and §9.
	ShedDrops []uint32
	// LastN is the first R̂ beyond the table (Table.Len() << Shift): from
	// it on, P(R̂) = PassBase / 2^16 + (R̂ − LastN) × (1 − LastThr / 2^32),
	// and q is computed per tick (Beyond).
	LastN uint64
	// PassBase is P(LastN) in packets with 16 − PassShift fractional
	// bits.
	PassBase uint64
	// PassShift is 0 but for tables past 2^46 packets (Shift over 26),
	// whose counts of passes would overflow 64 bits at 16 fractional
	// bits: every count of passes of the smooth shape (PassBase, pass16)
	// then has 16 − PassShift (at least 11) fractional bits. The program
	// derives it from the settings' shift (smooth.h sm_pass_shift).
	PassShift uint
	// LastThr is the last tier's drop threshold on the prandom scale, the
	// ordinal table's last entry (the program's tl_settings.last_thr):
	// past LastN each packet adds 1 − LastThr / 2^32 to P.
	LastThr uint32
	// PassLast is the last tier's pass probability, 1 − drop, with 16
	// fractional bits: the settings' sm_pass_last, which the program no
	// longer reads (16 bits made a last tier of drop 99.99 % pass 7 %
	// too much); kept so that the settings keep their layout.
	PassLast uint64
}

// Beyond returns q(R̂) on the prandom scale for R̂ ≥ LastN, from the closed
// form, in the integer arithmetic the program uses (passThreshold): on the
// 2^32 scale, so that a flood of 10⁶ × max, whose pass probability is
// about 10⁻⁶, keeps its P(R̂) within 10⁻³ (docs/design.md §9 property 5). R̂ is
// below 2^(48 + PassShift).
func (t SmoothTable) Beyond(rhat uint64) uint32 {
	rhat = max(rhat, t.LastN, 1)
	return passThreshold(t.pass16(rhat), rhat, t.PassShift)
}

// pass16 is P(R̂) with 16 − PassShift fractional bits for R̂ ≥ LastN: the
// closed form with the last tier's pass probability on 32 bits, no
// division (smooth.h sm_pass_beyond).
func (t SmoothTable) pass16(rhat uint64) uint64 {
	var pl uint64 // the last tier's pass probability, 32 fractional bits
	if t.LastThr != AlwaysDrop {
		pl = 1<<32 - uint64(t.LastThr)
	}
	return t.PassBase + mulShr(rhat-t.LastN, pl, 16+t.PassShift)
}

// mulShr is a × b >> k, exact, while (a >> k) × b and 2^k × b are below
// 2^64 (smooth.h sm_mul_shr).
func mulShr(a, b uint64, k uint) uint64 {
	return (a>>k)*b + (a&(1<<k-1))*b>>k
}

// smoothPassShift is SmoothTable.PassShift of a table at step 2^shift.
func smoothPassShift(shift uint) uint { return max(shift, 26) - 26 }

// passThreshold is the drop threshold of pass probability p / r, where p
// is a count of passes with 16 − ps fractional bits and r ≥ 1 a count of
// packets: 2^32 − p × 2^(16+ps) / r, as the program computes it
// (smooth.h sm_pass_thr). The product is exact while p < 2^(48−ps); past
// that r ≥ 2^32, and r is shifted down instead (a relative error below
// 2^-32). The probability is never rounded to zero while p > 0: its least
// value is 2 / 2^32, the least that AlwaysDrop (2^32 − 1) leaves. 0 when
// it is 1 or more, AlwaysDrop when p is 0.
func passThreshold(p, r uint64, ps uint) uint32 {
	if p == 0 {
		return AlwaysDrop
	}
	k := 16 + ps
	var ratio uint64
	switch {
	case p < 1<<(64-k):
		ratio = p << k / r
	case r>>k != 0:
		ratio = p / (r >> k)
	default:
		return 0
	}
	if ratio >= 1<<32 {
		return 0
	}
	return uint32(1<<32 - max(ratio, 2))
}

// Smooth returns q(R̂) on the prandom scale and the tier of R̂, as the
// program applies them: entry R̂ >> Shift of the smooth table, or Beyond
// past it.
func (t Table) Smooth(rhat uint64) (tier int, thr uint32) {
	if len(t.Smoothed.Thresholds) == 0 {
		return 0, 0
	}
	i := rhat >> t.Shift
	if i >= uint64(len(t.Smoothed.Thresholds)) {
		return int(t.Tiers[len(t.Tiers)-1]), t.Smoothed.Beyond(rhat)
	}
	return int(t.Tiers[i]), t.Smoothed.Thresholds[i]
}

// Pass returns P(R̂) as the smooth table encodes it: R̂ × (1 − q(R̂)),
// packets. The over-budget share of docs/design.md §6 is computed from it.
func (t Table) Pass(rhat uint64) float64 {
	_, thr := t.Smooth(rhat)
	return float64(rhat) * (1 - DropRatio(thr))
}

// compileSmooth fills t.Smoothed from the ordinal table t: q(R) = 1 −
// P(R)/R with P the ordinal expectation (Table.Expected), the passes per
// window the ordinal shape gives, accumulated entry by entry: packets
// (i−1)<<Shift + 1 .. i<<Shift − 1 are in entry i−1 and packet i<<Shift in
// entry i.
func compileSmooth(t *Table) {
	n := len(t.Thresholds)
	st := SmoothTable{Thresholds: make([]uint32, n), ShedDrops: make([]uint32, len(t.Drops))}
	step := float64(uint64(1)<<t.Shift - 1)
	var dropped float64
	for i := 1; i < n; i++ {
		dropped += step*DropRatio(t.Thresholds[i-1]) + DropRatio(t.Thresholds[i])
		st.Thresholds[i] = smoothThreshold(dropped, uint64(i)<<t.Shift)
	}
	st.LastN = uint64(n) << t.Shift
	e := t.Expected(st.LastN)
	st.PassShift = smoothPassShift(t.Shift)
	st.PassBase = uint64(math.Round(e.Passed * float64(uint64(1)<<(16-st.PassShift))))
	st.PassLast = uint64(math.Round((1 - DropRatio(t.Thresholds[n-1])) * (1 << 16)))
	st.LastThr = t.Thresholds[n-1]
	t.Smoothed = st
	K := len(t.Bounds)
	for k := 1; k <= K; k++ {
		if k == K {
			st.ShedDrops[k] = AlwaysDrop
			continue
		}
		_, st.ShedDrops[k] = t.Smooth(t.TierStart(k + 1))
	}
}

// smoothThreshold is round(q × 2^32) for q = dropped/r, the drop ratio of
// a window offered r packets of which dropped are dropped in expectation:
// 0 when nothing is, AlwaysDrop when everything is.
func smoothThreshold(dropped float64, r uint64) uint32 {
	switch {
	case r == 0 || dropped <= 0:
		return 0
	case dropped >= float64(r):
		return AlwaysDrop
	}
	// Short of AlwaysDrop while anything passes (docs/design.md §9 property 5).
	v := math.Round(dropped / float64(r) * (1 << 32))
	return uint32(min(v, AlwaysDrop-1))
}

// ShareThreshold returns the drop threshold of an over-budget packet under
// ShapeSmooth (docs/design.md §6) when the window's in-budget estimate is rin
// and its estimate of all selected packets rtot: the over-budget packets
// together pass P(rtot) − P(rin), so each is passed with probability
// (P(rtot) − P(rin)) / (rtot − rin), in 16-bit fixed point as the program
// computes it. With no over-budget estimate beyond rin yet, it is q at
// rin + 1.
func (t Table) ShareThreshold(rin, rtot uint64) uint32 {
	if rtot <= rin+1 {
		_, thr := t.Smooth(rin + 1)
		return thr
	}
	pin, ptot := t.pass16(rin), t.pass16(rtot)
	if ptot <= pin {
		return AlwaysDrop
	}
	return passThreshold(ptot-pin, rtot-rin, t.Smoothed.PassShift)
}

// pass16 is P(r) with 16 − PassShift fractional bits: past the table the
// closed form (SmoothTable.pass16), in it r × (1 − q(r)) with q at 16
// bits.
func (t Table) pass16(r uint64) uint64 {
	if len(t.Smoothed.Thresholds) != 0 && r >= t.Smoothed.LastN {
		return t.Smoothed.pass16(r)
	}
	_, thr := t.Smooth(r)
	if thr == AlwaysDrop {
		return 0
	}
	return mulShr(r, 1<<16-uint64(thr>>16), t.Smoothed.PassShift)
}
