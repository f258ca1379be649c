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

/* The select rules whose dests hold k's address (bit i: rule i), from
 * one longest-prefix lookup in select_dests, whose entry holds the rules
 * of every prefix that contains the address; kept in this CPU's
 * dest_cache for dests_hold. A global function, so that the verifier
 * checks it once, with its argument unknown (TestVerifierComplexity). */
__noinline int tl_dests_lookup(const struct tl_lpm_key *k)
{
	if (!k)
		return 0;
	/* A copy on this function's stack: Linux 6.1's verifier takes a global
	 * function's pointer argument (PTR_TO_MEM) as no map key. */
	struct tl_lpm_key key = *k;
	__u32 *held = bpf_map_lookup_elem(&select_dests, &key);
	__u32 rules = held ? *held : 0;
	__u32 zero = 0;
	struct tl_dest_cache *dc = bpf_map_lookup_elem(&dest_cache, &zero);
	if (dc) {
		dc->tag = key.tag;
		dc->rules = rules;
		__builtin_memcpy(dc->addr, k->addr, 16);
		dc->state = 1;
	}
	return rules;
}

/* Is the packet's destination the one dc holds? Read from the packet,
 * without building a key: IPv4 as the last word of the IPv4-mapped form
 * load_addr makes. 0 when the header is cut short (load_addr's key is
 * then all zero: the trie decides). */
static __always_inline int dests_same(const struct pkt *p, const struct tl_dest_cache *dc)
{
	if (p->l3proto == ETH_P_IP) {
		const struct iphdr *ip = p->l3;
		return (void *)(ip + 1) <= p->end && *(const __u32 *)(dc->addr + 12) == ip->daddr;
	}
	const struct ipv6hdr *ip6 = p->l3;
	if ((void *)(ip6 + 1) > p->end)
		return 0;
	const __u64 *d = (const __u64 *)&ip6->daddr;
	return *(const __u64 *)dc->addr == d[0] && *(const __u64 *)(dc->addr + 8) == d[1];
}

/* Which of rules (bit i: select rule i) hold the packet's destination
 * in their dests? Answered from this CPU's dest_cache when it holds the
 * same address (family and slot), whatever rules it was asked for, else
 * from the trie (tl_dests_lookup): a collector's traffic, all to one
 * address, then costs a few compares per packet and no trie walk
 * (BenchmarkProgram selected-pass-local). */
static __always_inline __u32 dests_hold(const struct pkt *p, __u32 slot, __u32 rules)
{
	__u32 tag = (p->l3proto == ETH_P_IPV6 ? TL_LPM_TAG_IPV6 : 0) | slot << TL_DEST_RULE_BITS;
	__u32 zero = 0;
	struct tl_dest_cache *dc = bpf_map_lookup_elem(&dest_cache, &zero);
	if (dc && dc->state && dc->tag == tag && dests_same(p, dc))
		return dc->rules & rules;
	struct tl_lpm_key k = { .prefixlen = TL_LPM_TAG_BITS + TL_LPM_ADDR_BITS, .tag = tag };
	load_addr(p, 1, k.addr);
	return tl_dests_lookup(&k) & rules;
}

/* is_selected's answer for a TCP segment that is no SYN, to a port and
 * destination a syn rule selects, under count: bytes: its payload counts
 * in the window, and it is never shed (docs/design.md §2). */
#define TL_SEL_COUNTED 2

/* Does a select rule of this slot count the packet? 1: judge it;
 * TL_SEL_COUNTED: count it only; 0: no. */
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
	/* The rules with dests that select this port; a rule that counts
	 * SYNs only (syn_rules) does not judge a packet without one, which
	 * under count: bytes it counts (TL_SEL_COUNTED): one lookup for both. */
	__u32 judged = p->syn ? ~0U : ~s->syn_rules;
	__u32 bytes = s->flags & TL_COUNT_BYTES;
	__u32 rules = pe->cidr_rules & (bytes ? ~0U : judged);
	__u32 held = rules ? dests_hold(p, slot, rules) : 0;
	if (held & judged)
		return 1;
	return bytes && !p->syn && (held || (pe->flags & TL_PORT_SYN)) ? TL_SEL_COUNTED : 0;
}

/* Does a select rule of this slot count an unclassified frame (docs/design.md
 * §2), whose port is unknown? Any rule without dests does; a rule with
 * dests does when they hold the destination. A frame with no L3 header we
 * know (TL_UNCL_VLAN_DEPTH) is counted by any rule. */
static __always_inline int uncl_selected(const struct pkt *p, __u32 slot, const struct tl_settings *s)
{
	if ((s->flags & TL_ANY_DEST) || p->uncl == 1 + TL_UNCL_VLAN_DEPTH)
		return 1;
	return s->dest_rules && dests_hold(p, slot, s->dest_rules);
}

static __always_inline int is_exempt(const struct pkt *p, __u32 slot)
{
	struct tl_lpm_key k = { .prefixlen = TL_LPM_TAG_BITS + TL_LPM_ADDR_BITS, .tag = slot };
	if (p->l3proto == ETH_P_IPV6)
		k.tag |= TL_LPM_TAG_IPV6;
	load_addr(p, 0, k.addr);
	return bpf_map_lookup_elem(&exempt_sources, &k) != NULL;
}

/* Entry n >> shift of the slot's table, the last entry past its end: tier
 * and threshold. Returns 0 when the lookup fails (it cannot: key <
 * max_entries). The smooth shape reads its table here (smooth.h): its
 * entries run past last_n, to sm_last_n. */
static __always_inline int table_entry(const struct tl_settings *s, __u32 slot, __u64 n, __u32 *tier, __u32 *thr)
{
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

/* The ordinal tier-table entry of a packet with window count n: tier and
 * drop threshold. n from last_n on takes the last entry, which settings
 * hold: the last tier runs to infinity, and a saturated window needs no
 * table lookup. Returns 0 when the lookup fails (it cannot). */
static __always_inline int tier_entry(const struct tl_settings *s, __u32 slot, __u64 n, __u32 *tier, __u32 *thr)
{
	*thr = s->last_thr;
	*tier = s->last_tier;
	if (n >= s->last_n)
		return 1;
	return table_entry(s, slot, n, tier, thr);
}

#endif /* __TL_POLICY_H */
