package tiers

import (
	"net/netip"
	"slices"
)

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

// LocalFit is how the host's destinations fit a policy's dests: local
// rules (FitLocal).
type LocalFit struct {
	// Kept is the destinations the rules count, in the host's order.
	Kept []LocalDest
	// Uncounted is how many of the host's destinations they leave out.
	Uncounted int
	// Entries is the entries all of them would take, and Budget the most
	// the rules can hold (LocalBudget), in destination trie entries.
	Entries, Budget int
}

// FitLocal returns the host's destinations, host, that policy p's
// dests: local rules can count together: all of them, unless they would
// take more than LocalBudget(p) entries (one per destination that some
// rule names, however many do: a UDP rule names each, a TCP rule each
// unicast one, Policy.WithLocal; none for one of p's own dests). Then it
// keeps the unicast ones first (the host's addresses, which every rule
// counts), in order, and leaves the rest uncounted: a host over the limit
// is a condition of the running agent, never a policy refused.
func FitLocal(p Policy, host []LocalDest) LocalFit {
	local, udp := false, false // some rule names unicast ones; all
	own := map[netip.Prefix]bool{}
	for _, r := range p.Select {
		local = local || r.Local
		udp = udp || (r.Local && r.Proto != ProtoTCP)
		for _, d := range r.Dests {
			own[d.Masked()] = true
		}
	}
	// cost is the entries d takes beside those in taken: 1, or 0 when
	// no rule names it or it has one already.
	cost := func(taken map[netip.Prefix]bool, d LocalDest) int {
		if own[d.Prefix.Masked()] || taken[d.Prefix.Masked()] || !(udp || (local && d.Unicast)) {
			return 0
		}
		return 1
	}
	budget, total := LocalBudget(p), 0
	seen := make(map[netip.Prefix]bool, len(host))
	for _, d := range host {
		total += cost(seen, d)
		seen[d.Prefix.Masked()] = true
	}
	kept := host
	if total > budget {
		keep := make(map[netip.Prefix]bool, len(host))
		n := 0
		for _, unicast := range []bool{true, false} {
			for _, d := range host {
				if c := cost(keep, d); d.Unicast == unicast && n+c <= budget {
					n += c
					keep[d.Prefix.Masked()] = true
				}
			}
		}
		kept = slices.DeleteFunc(slices.Clone(host), func(d LocalDest) bool { return !keep[d.Prefix.Masked()] })
	}
	return LocalFit{Kept: kept, Uncounted: len(host) - len(kept), Entries: total, Budget: budget}
}
