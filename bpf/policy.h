/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The active policy: its slot and settings, the select rules and exempt
 * sources that decide whether a packet is judged, and its tier-table entry.
 * The agent writes a whole slot, then flips active_slot (maps.h). */
#ifndef __TL_POLICY_H
#define __TL_POLICY_H

#include "maps.h"
#include "parse.h"

/* The settings of the active slot, and the slot; NULL when a lookup fails
 * (it cannot: both maps are arrays). zero is a key 0 on the caller's
 * stack, which tl_judge uses again for the window: one key for both keeps
 * the judge as short as it was before this helper (13 instructions). */
static __always_inline struct tl_settings *active_settings(__u32 *zero, __u32 *slot)
{
	__u32 *active = bpf_map_lookup_elem(&active_slot, zero);
	if (!active)
		return NULL;
	*slot = *active & (TL_SLOTS - 1);
	return bpf_map_lookup_elem(&settings, slot);
}

/* Is the full-length key k (tag and address) in select_dests? Answered
 * from this CPU's dest_cache when it holds k (maps.h). A global function,
 * so that the verifier checks it once, not on every turn of the rules'
 * loop that calls it (TestVerifierComplexity). */
__noinline int tl_dest_in(struct tl_lpm_key *k)
{
	if (!k)
		return 0;
	__u32 zero = 0;
	struct tl_dest_cache *dc = bpf_map_lookup_elem(&dest_cache, &zero);
	if (dc && dc->state && dc->tag == k->tag && *(__u64 *)dc->addr == *(__u64 *)k->addr &&
	    *(__u64 *)(dc->addr + 8) == *(__u64 *)(k->addr + 8))
		return dc->state == 2;
	/* A copy on this function's stack: Linux 6.1's verifier takes a global
	 * function's pointer argument (PTR_TO_MEM) as no map key. */
	struct tl_lpm_key key = *k;
	int in = bpf_map_lookup_elem(&select_dests, &key) != NULL;
	if (dc) {
		dc->tag = k->tag;
		__builtin_memcpy(dc->addr, k->addr, 16);
		dc->state = in ? 2 : 1;
	}
	return in;
}

/* Does a select rule of this slot count the packet? */
static __always_inline int is_selected(const struct pkt *p, __u32 slot, const struct tl_settings *s)
{
	__u32 key = (slot * 2 + (p->l4proto == IPPROTO_TCP)) * TL_PORT_KEYS + p->dport;
	struct tl_port *pe = bpf_map_lookup_elem(&ports, &key);
	if (!pe)
		return 0;
	if (pe->flags & TL_PORT_PACKETS)
		return 1;
	if ((pe->flags & TL_PORT_SYN) && p->syn)
		return 1;

	__u32 rules = pe->cidr_rules;
	if (!rules)
		return 0;
	struct tl_lpm_key k = { .prefixlen = TL_LPM_TAG_BITS + TL_LPM_ADDR_BITS };
	load_addr(p, 1, k.addr);
	__u32 family = p->l3proto == ETH_P_IPV6 ? TL_LPM_TAG_IPV6 : 0;
	for (__u32 i = 0; i < TL_MAX_RULES; i++) {
		if (!(rules & (1U << i)))
			continue;
		if ((s->syn_rules & (1U << i)) && !p->syn)
			continue;
		k.tag = family | slot << TL_DEST_RULE_BITS | i;
		if (tl_dest_in(&k))
			return 1;
	}
	return 0;
}

/* Does a select rule of this slot count an unclassified frame (DESIGN.md
 * §2), whose port is unknown? Any rule without dests does; a rule with
 * dests does when they hold the destination. A frame with no L3 header we
 * know (TL_UNCL_VLAN_DEPTH) is counted by any rule. */
static __always_inline int uncl_selected(const struct pkt *p, __u32 slot, const struct tl_settings *s)
{
	if ((s->flags & TL_ANY_DEST) || p->uncl == 1 + TL_UNCL_VLAN_DEPTH)
		return 1;
	__u32 rules = s->dest_rules;
	struct tl_lpm_key k = { .prefixlen = TL_LPM_TAG_BITS + TL_LPM_ADDR_BITS };
	load_addr(p, 1, k.addr);
	__u32 family = p->l3proto == ETH_P_IPV6 ? TL_LPM_TAG_IPV6 : 0;
	for (__u32 i = 0; i < TL_MAX_RULES; i++) {
		if (!(rules & (1U << i)))
			continue;
		k.tag = family | slot << TL_DEST_RULE_BITS | i;
		if (bpf_map_lookup_elem(&select_dests, &k))
			return 1;
	}
	return 0;
}

static __always_inline int is_exempt(const struct pkt *p, __u32 slot)
{
	struct tl_lpm_key k = { .prefixlen = TL_LPM_TAG_BITS + TL_LPM_ADDR_BITS, .tag = slot };
	if (p->l3proto == ETH_P_IPV6)
		k.tag |= TL_LPM_TAG_IPV6;
	load_addr(p, 0, k.addr);
	return bpf_map_lookup_elem(&exempt_sources, &k) != NULL;
}

/* The tier-table entry of a packet with window count n: tier and drop
 * threshold. n from last_n on takes the last entry, which settings hold:
 * the last tier runs to infinity, and a saturated window needs no table
 * lookup. Returns 0 when the lookup fails (it cannot: key < max_entries). */
static __always_inline int tier_entry(const struct tl_settings *s, __u32 slot, __u64 n, __u32 *tier, __u32 *thr)
{
	*thr = s->last_thr;
	*tier = s->last_tier;
	if (n >= s->last_n)
		return 1;
	__u64 idx = n >> (s->shift & TL_SHIFT_MASK);
	if (idx >= s->table_len)
		idx = s->table_len - 1;
	__u32 key = slot * TL_TABLE_MAX + (__u32)idx;
	struct tl_entry *e = bpf_map_lookup_elem(&tier_table, &key);
	if (!e)
		return 0;
	*thr = e->thr;
	*tier = e->tier;
	return 1;
}

#endif /* __TL_POLICY_H */
