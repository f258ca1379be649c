package tiers

// State is what the running agent knows, beside the policy it was given,
// that decides the policy it compiles (Effective): what its rooms learnt
// or follow.
type State struct {
	// LearntMax is the adaptive max's learnt max, packets per window
	// (docs/design.md §8); 0 when none is learnt for the given policy's
	// auto bounds. It is taken only under max: auto.
	LearntMax uint64
	// Fallback is set while the fleet controller holds the member in
	// fallback (docs/design.md §12); Members is the member count the
	// store last returned, 0 when it has not answered since start.
	Fallback bool
	Members  int
	// LastShare is, with fallback: last, the member's last share of
	// fleet.max (FleetLastShare), packets per window, while it holds; 0
	// once it decayed to share, or when none was seen.
	LastShare uint64
	// Local is the host's destinations, for dests: local rules, as the
	// agent last read them.
	Local []LocalDest
	// LicenseMax is the window's byte budget the license allows
	// (License.Pace's Max, docs/design.md §13), bytes per window; 0 when
	// the policy has no license or none is paced yet.
	LicenseMax uint64
}

// Learnt returns given as the fleet and the adaptive max know it: with
// max: auto, at the learnt max (when one is learnt); never the fallback,
// with no local destinations resolved. Its table and that of its Local
// policy are the fold of a member with max: auto (FleetOthersWithAuto).
func (s State) Learnt(given Policy) Policy {
	if given.Auto == nil || s.LearntMax == 0 {
		return given
	}
	return given.WithMax(s.LearntMax)
}

// Effective returns the policy that is compiled for the given policy in
// state s (docs/design.md §8, §12, §2):
//   - with max: auto, its max is the learnt one (Learnt);
//   - in fleet fallback, it is the fallback policy (FleetFallbackPolicy),
//     fleet off; with max: auto its max is the smaller of the fallback's
//     and the learnt one, so that a member never passes more than its
//     collector takes;
//   - with a license, its max is at most s.LicenseMax (the smaller of it
//     and the max in force, learnt or given, wins; §13): with fleet: (and
//     not in fallback) fleet.max, the fleet's table, else max; per-source
//     budgets, percents of max, keep their shares of it;
//   - its dests: local rules hold the host's destinations of s.Local that
//     fit (FitLocal), the rest left uncounted, as fit says.
//
// given is not changed. Effective is pure and never fails: given is a
// valid policy, and Compile validates what it returns.
func Effective(given Policy, s State) (Policy, LocalFit) {
	p := s.Learnt(given)
	if s.Fallback {
		q := p.FleetFallbackLast(s.Members, s.LastShare)
		if p.Fleet != nil && p.Auto != nil {
			q.Max = min(q.Max, p.Max)
		}
		p = q
	}
	p = p.withLicenseMax(s.LicenseMax)
	fit := FitLocal(p, s.Local)
	return p.WithLocal(fit.Kept), fit
}

// withLicenseMax returns p with its max at most m (fleet.max with a
// fleet, else max), p itself when m is 0, p has no license or its max is
// m or less already.
func (p Policy) withLicenseMax(m uint64) Policy {
	switch {
	case m == 0 || p.License == nil:
		return p
	case p.Fleet != nil:
		if m >= p.Fleet.Max {
			return p
		}
		q := p.Clone()
		q.Fleet.Max = m
		return q
	case m >= p.Max:
		return p
	}
	return p.WithMax(m)
}
