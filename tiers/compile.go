package tiers

import (
	"math/bits"
)

// AlwaysDrop is the drop threshold of a tier that drops every packet
// (drop 100%): Dropped reports true for it whatever the random draw.
const AlwaysDrop = 0xFFFFFFFF

// Table is a compiled policy, the seed's "cache": what the XDP program looks
// up for the n-th selected packet of a window (n counts from 1). Entry i
// describes the packets with n >> Shift == i; n beyond the table uses the
// last entry. The zero Table passes everything.
type Table struct {
	// Thresholds[i] is the drop threshold of entry i on the
	// bpf_get_prandom_u32 scale: Drops[Tiers[i]].
	Thresholds []uint32
	// Tiers[i] is the tier of entry i: that of packet n = i << Shift, the
	// largest k with T_k <= n, or 0 below T_1.
	Tiers []uint8
	// Shift is the step of the table as a power of two: entry i covers
	// packets i<<Shift .. (i+1)<<Shift - 1. It is 0 (one entry per packet)
	// unless T_last + 1 entries would exceed MaxTableEntries.
	Shift uint
	// Bounds are the exact thresholds T_1..T_K in packets, T_k =
	// floor(max × at_k / 100). They are non-decreasing; two are equal when
	// the floor merges them, and the tier between is then empty.
	Bounds []uint64
	// Drops[k] is the drop threshold of tier k, round(drop_k/100 × 2^32):
	// 0 never drops, AlwaysDrop always drops, and a drop below 100% that
	// would round to 2^32 - 1 or more is 2^32 - 2. Drops[0], tier 0, is 0.
	Drops []uint32
	// MaxRoundingError is the most packets by which the table moves a tier
	// boundary (always later: a tier starts at its threshold rounded up to
	// a multiple of 1<<Shift). It is 0 when Shift is 0 and at most
	// (1<<Shift) - 1.
	MaxRoundingError uint64
	// Selectors are the policy's select rules and exempt sources, encoded
	// for the program's maps.
	Selectors Selectors
	// Severity is the policy's severity-aware shedding, if any.
	Severity SeverityTable
	// Sources is the per-source budget, encoded for the program's
	// settings; the zero value is off.
	Sources SourceBudget
	// Shape is the policy's shape; Smoothed is filled for ShapeSmooth
	// only (DESIGN.md §9).
	Shape    Shape
	Smoothed SmoothTable
	// Record is the shed record's sampling (DESIGN.md §10), encoded for
	// the program's settings; the zero value samples nothing.
	Record RecordTable
	// Settings is the rest of what the settings map gets: the window, its
	// ticks, the mode, the tier starts and the counts the program's limits
	// bound.
	Settings Settings
}

// thresholdOf is floor(max × at / 100) for at in micro-percent, exactly.
// Validate's limits keep the result below 2^64.
func thresholdOf(max uint64, atMicro int64) uint64 {
	hi, lo := bits.Mul64(max, uint64(atMicro))
	q, _ := bits.Div64(hi, lo, microHundred)
	return q
}

// dropThreshold is round(drop/100 × 2^32) for drop in micro-percent, with 0
// for 0% and AlwaysDrop for 100%. A fraction of 2^32 is never exactly one
// half here (10^8 has no factor 2 beyond 2^8 < 2^32), so rounding has no
// ties.
func dropThreshold(dropMicro int64) uint32 {
	switch {
	case dropMicro <= 0:
		return 0
	case dropMicro >= microHundred:
		return AlwaysDrop
	}
	v := (uint64(dropMicro)<<32 + microHundred/2) / microHundred
	if v >= AlwaysDrop {
		return AlwaysDrop - 1
	}
	return uint32(v)
}

// bounds returns T_1..T_K of a policy whose percents and max are in range
// (Validate keeps every product below 2^64), of TableMax: fleet.max when
// fleet is on.
func (p Policy) bounds() []uint64 {
	b := make([]uint64, len(p.Tiers))
	for k, t := range p.Tiers {
		b[k] = thresholdOf(p.TableMax(), t.At.micro)
	}
	return b
}

// TierOf returns the tier of the n-th selected packet of a window (n from 1)
// given the first n of tiers 1..K in bounds: the largest k with
// bounds[k-1] <= n, or 0 when n < bounds[0]. Compile fills the
// table with it, Policy.TierOf applies it to the exact thresholds, and the
// agent to the bounds the program's table applies (bpf.Active).
func TierOf(bounds []uint64, n uint64) int {
	k := 0
	for k < len(bounds) && bounds[k] <= n {
		k++
	}
	return k
}

// tableLen is the number of entries that puts T_last in the last one at
// step 1<<s: the entries cover n = 0 .. ceil(T_last / 2^s) << s.
func tableLen(last uint64, s uint) uint64 {
	return ceilShift(last, s) + 1
}

// ceilShift is ceil(x / 2^s).
func ceilShift(x uint64, s uint) uint64 {
	return (x >> s) + min(x&(1<<s-1), 1)
}

// Compile validates p and compiles it into the Table the XDP program reads
// (DESIGN.md §2): the tier table, and the selectors in their key encoding,
// so that package bpf only writes what Compile made. Thresholds are exact: T_k = floor(max × at_k / 100) in
// integer arithmetic, so 40000 × 70% is 28000. The last tier runs from
// T_last to infinity, which fixes the seed's fill loops (a gap or an
// overwrite when the last tier is not at 100%).
//
// The table has ceil(T_last / 2^Shift) + 1 entries, where Shift is the
// smallest that keeps it within MaxTableEntries; with Shift 0 that is
// T_last + 1. Entry i gets the tier of packet i << Shift. When Shift > 0 a
// tier boundary T_k not on a multiple of 2^Shift moves up to it (by at most
// 2^Shift - 1 packets, MaxRoundingError exactly), and the last entry is
// always in the last tier.
//
// tickNs is the kernel's tick in ns where the program has its tick gate,
// 0 where it reads the clock on every packet (bpf.Limiter.Tick): the
// window's ticks derive from it (Table.Settings).
//
// Returns the *ConfigError of Validate for an invalid policy.
func Compile(p Policy, tickNs uint64) (Table, error) {
	if err := p.Validate(); err != nil {
		return Table{}, err
	}
	bounds := p.bounds()
	drops := make([]uint32, len(p.Tiers)+1)
	for k, t := range p.Tiers {
		drops[k+1] = dropThreshold(t.Drop.micro)
	}
	last := bounds[len(bounds)-1]
	var shift uint
	for tableLen(last, shift) > MaxTableEntries {
		shift++
	}
	n := tableLen(last, shift)
	t := Table{
		Thresholds: make([]uint32, n),
		Tiers:      make([]uint8, n),
		Shift:      shift,
		Bounds:     bounds,
		Drops:      drops,
		Selectors:  compileSelectors(p),
		Severity:   compileSeverity(p, drops),
		Sources:    compileSources(p),
		Record:     compileRecord(p),
		Shape:      p.Shape,
	}
	for i := range n {
		k := TierOf(bounds, i<<shift)
		t.Tiers[i] = uint8(k)
		t.Thresholds[i] = drops[k]
	}
	if p.Shape == ShapeSmooth {
		compileSmooth(&t)
	}
	for _, b := range bounds {
		t.MaxRoundingError = max(t.MaxRoundingError, ceilShift(b, shift)<<shift-b)
	}
	t.Settings = compileSettings(p, t, tickNs)
	return t, nil
}

// Len returns the number of entries.
func (t Table) Len() int { return len(t.Thresholds) }

// Lookup returns the tier and drop threshold of the n-th selected packet of
// a window (n from 1), as the XDP program does: entry n >> Shift, clamped to
// the last entry. The zero Table returns tier 0 and threshold 0.
func (t Table) Lookup(n uint64) (tier int, thr uint32) {
	if len(t.Thresholds) == 0 {
		return 0, 0
	}
	i := n >> t.Shift
	if i >= uint64(len(t.Thresholds)) {
		i = uint64(len(t.Thresholds)) - 1
	}
	return int(t.Tiers[i]), t.Thresholds[i]
}

// TierStart returns the first packet count n that Lookup puts in tier k or
// above: 1 for tier 0, and T_k rounded up to a multiple of 1<<Shift for
// tier k >= 1 (T_k itself when Shift is 0). Tier k is empty when
// TierStart(k) == TierStart(k+1). It panics for k outside 0..len(Bounds).
func (t Table) TierStart(k int) uint64 {
	if k == 0 {
		return 1
	}
	return ceilShift(t.Bounds[k-1], t.Shift) << t.Shift
}

// TierOf returns the exact tier of the n-th selected packet of a window
// (n from 1): TierOf(p.Thresholds(), n). Unlike Table.Lookup it never
// rounds. It returns 0 when p does not Validate.
func (p Policy) TierOf(n uint64) int {
	return TierOf(p.Thresholds(), n)
}

// Thresholds returns T_1..T_K in packets, T_k = floor(max × at_k / 100)
// computed exactly, or nil when the policy does not Validate.
func (p Policy) Thresholds() []uint64 {
	if p.Validate() != nil {
		return nil
	}
	return p.bounds()
}
