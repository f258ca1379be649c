package tiers

import "time"

// Limits of a policy. The first three and MaxPrefixes match the sizes the
// BPF program is built with (bpf/consts.h: TL_MAX_TIERS, TL_MAX_RULES,
// TL_TABLE_MAX, TL_LPM_PREFIXES), which package bpf exports under the same
// names; the others keep every threshold exact in 64-bit arithmetic.
const (
	// MaxTiers is the most tiers a policy may have; tier 0, below the first
	// threshold, comes on top. Validate returns ErrTooMany beyond it.
	MaxTiers = 16
	// MaxSelectRules is the most select rules a policy may have. Validate
	// returns ErrTooMany beyond it.
	MaxSelectRules = 32
	// MaxTableEntries is the most entries of a compiled Table. A policy
	// whose last threshold needs more is compiled at a coarser step
	// (Table.Shift), as docs/design.md §2 says.
	MaxTableEntries = 1 << 20
	// MaxPackets is the largest Policy.Max, in packets per window (2^40,
	// about 10^12). Validate returns ErrMax beyond it.
	MaxPackets = 1 << 40
	// MaxAtPercent is the largest Tier.At, in percent of Max (1000 × max).
	// Validate returns ErrPercentRange beyond it.
	MaxAtPercent = 100000
	// MaxWindow is the longest Policy.Window. Validate returns ErrWindow
	// beyond it.
	MaxWindow = time.Hour
	// SmoothMinWindow is the shortest window of the smooth shape
	// (docs/design.md §9 property 5): its estimate counts the window in the
	// kernel's ticks (jiffies, 10 ms at HZ 100; or 4.19 ms without the
	// tick gate) from the tick the window opened in, so a window of a few
	// ticks is shaped off by up to half of it (+41 % to +118 % passes at
	// 1-2 ticks). From 20 ticks of the coarsest tick the steady passes are
	// within 3 % of P(R) (tiers TestSmoothShortWindows). Validate returns
	// ErrWindow below it under ShapeSmooth; the ordinal shape takes any
	// window.
	SmoothMinWindow = 200 * time.Millisecond
	// MaxPrefixes is the most prefixes of one policy's exempt sources, and
	// the most destination prefixes of all its select rules together
	// (bpf/consts.h TL_LPM_PREFIXES). Each LPM trie holds this many per
	// policy slot, so the next policy always fits beside the running one.
	// Validate returns ErrTooMany beyond it.
	MaxPrefixes = 1 << 16
	// MaxLocalPrefixes is the room the destination trie keeps per slot
	// beside MaxPrefixes (bpf/consts.h TL_LOCAL_PREFIXES) for the host's
	// own destinations, which the dests: local rules of one policy hold
	// once resolved (Rule.LocalDests), one entry each however many rules
	// name it: they have what the policy's dests leave of the two
	// (LocalBudget). Validate returns ErrTooMany beyond it.
	MaxLocalPrefixes = 1 << 12
)
