package tiers

// LocalBudget is the most of the host's destinations that the dests:
// local rules of p can hold together once resolved (Rule.LocalDests):
// what the destination trie holds per policy slot, MaxPrefixes +
// MaxLocalPrefixes, less the distinct prefixes of p's own dests. A
// destination takes one entry however many rules name it (DestKey): under
// the default policy, whose UDP and TCP rules both name each of the
// host's addresses, an address takes one, not two. The host's
// destinations are sized from the trie, not from a share of it kept for
// them: a kube-proxy IPVS node has an address per Service. Validate
// returns ErrTooMany beyond it; the agent never resolves more (it leaves
// the rest uncounted, and says so).
func LocalBudget(p Policy) int {
	q := p
	q.Select = make([]Rule, len(p.Select))
	for i, r := range p.Select {
		r.LocalDests = nil
		q.Select[i] = r
	}
	return MaxPrefixes + MaxLocalPrefixes - DestEntries(q)
}
