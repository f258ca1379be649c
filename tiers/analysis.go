package tiers

// EmptyTiers lists the tiers of t that no packet can reach, in ascending
// order: tier 0 when the first threshold T_1 is at most 1 packet, and tier k
// (1-based) when T_k equals T_{k+1}, because max is too small for their at
// percents to differ after flooring (docs/design.md §2). A tier listed here is
// legal but almost certainly not what the policy's author meant.
func EmptyTiers(t Table) []int {
	var out []int
	if len(t.Bounds) > 0 && t.Bounds[0] <= 1 {
		out = append(out, 0)
	}
	for k := 1; k < len(t.Bounds); k++ {
		if t.Bounds[k-1] == t.Bounds[k] {
			out = append(out, k)
		}
	}
	return out
}
