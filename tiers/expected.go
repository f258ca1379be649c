package tiers

// TierExpectation is the expected outcome of one tier within one window.
type TierExpectation struct {
	// Tier is the tier number, 0 below the first threshold.
	Tier int
	// First and Last are the inclusive range of packet counts n of the
	// window in this tier, as the compiled Table places them; both are 0
	// when the tier has no packet.
	First, Last uint64
	// Packets is the number of packets in the tier: Last - First + 1, or 0.
	Packets uint64
	// DropRatio is the probability of a drop, 0..1: the tier's threshold on
	// the bpf_get_prandom_u32 scale over 2^32, and 1 for AlwaysDrop. It is
	// what the BPF program does, within 2^-33 of drop/100.
	DropRatio float64
	// Passed and Dropped are the expected packets passed and dropped:
	// Packets × (1 - DropRatio) and Packets × DropRatio.
	Passed, Dropped float64
}

// Expectation is the expected outcome of one window of a policy under
// ModeEnforce (under ModeDryRun, Dropped is what is counted as would_drop
// while everything passes; under ModeOff everything passes).
type Expectation struct {
	// Offered is the number of selected packets in the window: n runs
	// 1..Offered.
	Offered uint64
	// Passed and Dropped are the expected packets passed and dropped in the
	// window; they sum to Offered.
	Passed, Dropped float64
	// Variance is the variance of Passed (and of Dropped), in packets²: the
	// sum over tiers of the binomial Packets × p × (1 - p).
	Variance float64
	// PerTier holds tiers 0..K, in order.
	PerTier []TierExpectation
}

// Expected returns the exact expected pass and drop counts of a window in
// which Offered selected packets arrive (n = 1..offered), per tier and in
// total. It uses the compiled Table — the boundaries as rounded by Shift and
// the thresholds on the 2^32 scale — so it describes what the BPF program
// does, and it computes each tier in closed form, whatever max is.
//
// Returns the *ConfigError of Validate for an invalid policy.
func Expected(p Policy, offered uint64) (Expectation, error) {
	t, err := Compile(p, 0)
	if err != nil {
		return Expectation{}, err
	}
	return t.Expected(offered), nil
}

// Expected is the package function Expected for a table already compiled.
func (t Table) Expected(offered uint64) Expectation {
	K := len(t.Bounds)
	e := Expectation{Offered: offered, PerTier: make([]TierExpectation, K+1)}
	for k := 0; k <= K; k++ {
		first := max(t.TierStart(k), 1)
		last := offered
		if k < K {
			next := t.TierStart(k + 1)
			if next == 0 {
				last = 0
			} else {
				last = min(last, next-1)
			}
		}
		var thr uint32
		if k < len(t.Drops) {
			thr = t.Drops[k]
		}
		te := TierExpectation{Tier: k, DropRatio: DropRatio(thr)}
		if first <= last {
			te.First, te.Last, te.Packets = first, last, last-first+1
		}
		n, q := float64(te.Packets), te.DropRatio
		te.Passed = n * (1 - q)
		te.Dropped = n * q
		e.Passed += te.Passed
		e.Dropped += te.Dropped
		e.Variance += n * q * (1 - q)
		e.PerTier[k] = te
	}
	return e
}

// DropRatio returns the probability, 0..1, that Dropped(thr, rnd) is true
// for a uniform rnd: thr / 2^32, and 1 for AlwaysDrop.
func DropRatio(thr uint32) float64 {
	if thr == AlwaysDrop {
		return 1
	}
	return float64(thr) / (1 << 32)
}
