package tiers

// LocalBudget is the most entries the dests: local rules of p can hold
// together once resolved, one per rule and host destination
// (Rule.LocalDests): what the destination trie holds per policy slot,
// MaxPrefixes + MaxLocalPrefixes, less p's own dests prefixes. The host's
// destinations are sized from the trie, not from a share of it kept for
// them: a kube-proxy IPVS node has an address per Service, and the
// default policy's two rules name each. Validate returns ErrTooMany
// beyond it; the agent never resolves more (it leaves the rest
// uncounted, and says so).
func LocalBudget(p Policy) int {
	dests := 0
	for _, r := range p.Select {
		dests += len(r.Dests)
	}
	return MaxPrefixes + MaxLocalPrefixes - dests
}
