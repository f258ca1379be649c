package tiers

import "strconv"

// Verdict is what the limiter did with a selected packet. The values are
// shared with the BPF program (enum tl_verdict in bpf/types.h) and index
// its stats maps: keep them.
type Verdict uint8

const (
	// VerdictPass: the packet passed (tier 0, the draw spared it, or mode
	// off).
	VerdictPass Verdict = 0
	// VerdictDrop: the packet was dropped (mode enforce).
	VerdictDrop Verdict = 1
	// VerdictWouldDrop: mode dry-run would have dropped the packet, and
	// passed it.
	VerdictWouldDrop Verdict = 2
)

// NumVerdicts is the number of verdicts, the size of a per-verdict array.
const NumVerdicts = 3

// Verdicts lists every verdict in value order, for loops over counters.
var Verdicts = [NumVerdicts]Verdict{VerdictPass, VerdictDrop, VerdictWouldDrop}

// String returns the metrics label of the verdict: "pass", "drop" or
// "would_drop"; "Verdict(N)" for an undefined value.
func (v Verdict) String() string {
	switch v {
	case VerdictPass:
		return "pass"
	case VerdictDrop:
		return "drop"
	case VerdictWouldDrop:
		return "would_drop"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Dropped is the drop decision of the XDP program: a packet whose drop
// threshold is thr and whose bpf_get_prandom_u32 draw is rnd is dropped when
// rnd < thr, and always when thr is AlwaysDrop (2^32 - 1, drop 100%). So a
// threshold of 0 never drops, and any other drops with probability
// thr / 2^32 — the seed's `random.nextInt(100) < rate`, on a finer scale.
func Dropped(thr, rnd uint32) bool {
	return thr == AlwaysDrop || rnd < thr
}
