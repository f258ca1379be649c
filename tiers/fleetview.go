package tiers

// The fleet's view with an expiry (docs/design.md §12, "A view that
// expires", "Partitions"): what the program applies alone when the view
// the agent last wrote has expired, and fallback: last's share.

// FleetLastHold is how many ttls fallback: last keeps a member's last share
// before it decays to share (docs/design.md §12, Partitions): 10, so 30 s
// at the default ttl.
const FleetLastHold = 10

// FleetMultMax is the largest multiplier on R̂ of the program's fallback,
// on 2^16 (bpf/consts.h TL_FLEET_MULT_MAX): a fallback max at least the
// table max ÷ 65,536. FleetRhatMax is the largest R̂ it makes
// (TL_FLEET_RHAT_MAX).
const (
	FleetMultMax = 1 << 32
	FleetRhatMax = 1 << 47
)

// FleetLastShare is fallback: last's max: own ÷ fleet × fleetMax, own this
// member's R̂_tot at the last report answered and fleet the fleet's
// (its own plus the others' sum), packets per window, at least 1; 0 when
// fleet is 0 (no load seen: the share's max applies).
func FleetLastShare(own, fleet, fleetMax uint64) uint64 {
	if fleet == 0 {
		return 0
	}
	own = min(own, fleet)
	// own ≤ fleet ≤ 2^47 and fleetMax ≤ 2^40: the product can overflow
	// 64 bits, so divide first when it would.
	var x uint64
	if own < 1<<23 {
		x = own * fleetMax / fleet
	} else {
		x = uint64(float64(own) / float64(fleet) * float64(fleetMax))
	}
	return min(max(x, 1), fleetMax)
}

// FleetFallbackMult is the program's fallback multiplier on R̂ (bpf/fleet.h),
// on 2^16: tableMax ÷ fbMax, rounded, within 1 and FleetMultMax. Judging a
// table compiled for tableMax at k·R̂ is judging one compiled for
// tableMax ÷ k at R̂, the tiers being percents of max: P_{M/k}(R) =
// P_M(k·R)/k, up to each threshold's rounding to a packet
// (TestFleetFallbackMultTable).
func FleetFallbackMult(tableMax, fbMax uint64) uint64 {
	if fbMax == 0 || tableMax == 0 {
		return 1 << SmoothFracBits
	}
	// tableMax ≤ 2^40: tableMax << 16 fits.
	k := (tableMax<<SmoothFracBits + fbMax/2) / fbMax
	return min(max(k, 1), FleetMultMax)
}

// FleetAlone returns the multiplier the program judges with alone once the
// view expires (bpf.Limiter.SetFleetFallback), when given is compiled in
// state s (Effective): the table max of Effective(given, s) over the max
// of the fallback the member reaches with no agent, Effective(given, s)
// in fallback with no last share (fallback: last's share needs the
// agent's clock to decay, so alone it is share's). 1.0 (2^16) without a
// fleet, and in fallback share or local, whose policy is already the
// fallback's.
func FleetAlone(given Policy, s State) uint64 {
	if given.Fleet == nil {
		return 1 << SmoothFracBits
	}
	p, _ := Effective(given, s)
	fs := s
	fs.Fallback, fs.LastShare = true, 0
	fb, _ := Effective(given, fs)
	return FleetFallbackMult(p.TableMax(), fb.Max)
}

// FleetPartitionBound is the most the fleet of n members of policy p
// passes per window once ttl has gone by with the members whose shares
// are cut cut off from the store, the others reaching it
// (docs/design.md §12, Partitions): C_M for those that reach it, plus,
// per cut member, C_{M÷n} (share), C_local (local, the policy's own max)
// or s × C_M (last, while its share s = R̂_i ÷ R̂_fleet holds). C_X is
// what a table of max X passes at offered, packets per window (the table's
// most, P_X(∞), for a last tier that drops 100 %). Returns Compile's
// errors; ErrFleet without a fleet or with n < 1.
func FleetPartitionBound(p Policy, n int, cut []float64, offered uint64) (float64, error) {
	if p.Fleet == nil || n < 1 {
		return 0, ErrFleet
	}
	most := func(q Policy) (float64, error) {
		t, err := Compile(q, 0)
		if err != nil {
			return 0, err
		}
		return t.Expected(offered).Passed, nil
	}
	cm, err := most(p)
	if err != nil {
		return 0, err
	}
	total := cm
	for _, s := range cut {
		switch p.Fleet.Fallback {
		case FallbackLast:
			total += s * cm
		default:
			c, err := most(p.FleetFallbackPolicy(n))
			if err != nil {
				return 0, err
			}
			total += c
		}
	}
	return total, nil
}
