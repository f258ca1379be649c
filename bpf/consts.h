/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Compile-time limits of the tierlimit XDP program. Each can be overridden
 * with -D at build time; the Go side reads the sizes back from the map specs,
 * so the two never disagree. */
#ifndef __TL_CONSTS_H
#define __TL_CONSTS_H

/* Most tiers a policy may have (tier 0, "below the first threshold", is extra). */
#ifndef TL_MAX_TIERS
#define TL_MAX_TIERS 16
#endif

/* Most entries of one compiled tier table; tiers.MaxTableEntries matches it. */
#ifndef TL_TABLE_MAX
#define TL_TABLE_MAX (1 << 20)
#endif

/* Policy slots. The agent writes the inactive slot, then flips active_slot,
 * so a packet sees either the whole old policy or the whole new one. */
#ifndef TL_SLOTS
#define TL_SLOTS 2
#endif

/* Most select rules per policy: one bit each in tl_port.cidr_rules. */
#ifndef TL_MAX_RULES
#define TL_MAX_RULES 32
#endif

/* Most VLAN tags parsed (802.1Q inside 802.1ad is QinQ: two). */
#ifndef TL_VLAN_MAX
#define TL_VLAN_MAX 2
#endif

/* Most IPv6 extension headers walked before the L4 header. */
#ifndef TL_IPV6_EXT_MAX
#define TL_IPV6_EXT_MAX 6
#endif

/* Most first fragments whose verdict is remembered for their followers. */
#ifndef TL_FRAG_ENTRIES
#define TL_FRAG_ENTRIES 16384
#endif

/* Most prefixes of one policy in the exempt trie, and in the destination
 * trie (all rules together): tiers.MaxPrefixes matches it. Each trie holds
 * this many per slot, so a reload always fits beside the running policy.
 * LPM tries allocate on insert: the size costs nothing until used. */
#ifndef TL_LPM_PREFIXES
#define TL_LPM_PREFIXES (1 << 16)
#endif
#define TL_LPM_ENTRIES (TL_SLOTS * TL_LPM_PREFIXES)

#endif /* __TL_CONSTS_H */
