/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Compile-time limits of the tierlimit XDP program. Each can be overridden
 * with -D at build time. Go never restates them: types.h exports each one in
 * enum tl_const (bpf2go -type), package bpf takes its limits from there and
 * from the map specs' max_entries, and bpf's contract test fails when
 * package tiers' mirror of them disagrees. */
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

/* Most options of a hop-by-hop or destination options header walked
 * (parse_ip.h tl_ipv6_options). */
#ifndef TL_HBH_OPTS_MAX
#define TL_HBH_OPTS_MAX 8
#endif

/* Most first fragments whose verdict is remembered for their followers. */
#ifndef TL_FRAG_ENTRIES
#define TL_FRAG_ENTRIES 16384
#endif

/* How long the drop verdict of a first fragment holds for its followers,
 * in ms. The kernel's reassembly horizon (net.ipv4.ipfrag_time, 30 s) is the
 * upper bound; fragments of one datagram arrive within milliseconds of each
 * other, and IPv4 ids wrap within seconds on a busy host. A verdict that
 * expires early only lets followers of a dropped first through, and the
 * kernel discards those when reassembly times out; one that lives long
 * drops unrelated datagrams that reuse the id. */
#ifndef TL_FRAG_TTL_MS
#define TL_FRAG_TTL_MS 1000
#endif

/* Slots of the interfaces the agent describes to the program (host.h),
 * by ifindex modulo this (a power of 2): an interface whose slot another
 * one holds is not checked, and its frames are counted as before (never
 * an evasion). */
#ifndef TL_IFACES
#define TL_IFACES 64
#endif

/* Most interfaces on which the program runs in generic (skb) mode. */
#ifndef TL_SKB_IFACES
#define TL_SKB_IFACES 64
#endif

/* Most prefixes of one policy in the exempt trie, and in the destination
 * trie (all rules together): tiers.MaxPrefixes matches it. Each trie holds
 * this many per slot, so a reload always fits beside the running policy.
 * LPM tries allocate on insert: the size costs nothing until used. */
#ifndef TL_LPM_PREFIXES
#define TL_LPM_PREFIXES (1 << 16)
#endif
#define TL_LPM_ENTRIES (TL_SLOTS * TL_LPM_PREFIXES)

/* Most of the host's own destinations that the dests: local rules of one
 * policy hold beside its dests (tiers.MaxLocalPrefixes), one entry per
 * destination however many rules name it: the destination trie holds
 * them per slot beside TL_LPM_PREFIXES. */
#ifndef TL_LOCAL_PREFIXES
#define TL_LOCAL_PREFIXES (1 << 12)
#endif
#define TL_DEST_ENTRIES (TL_SLOTS * (TL_LPM_PREFIXES + TL_LOCAL_PREFIXES))

/* Per-source budgets (docs/design.md §6): rows and columns of the count-min
 * sketch (columns a power of two), and groups over budget remembered for
 * tierlimit status --top. tiers.SketchRows, SketchCols and TopSources
 * match them. */
#ifndef TL_SKETCH_ROWS
#define TL_SKETCH_ROWS 2
#endif
#ifndef TL_SKETCH_COL_BITS
#define TL_SKETCH_COL_BITS 17
#endif
#define TL_SKETCH_COLS (1 << TL_SKETCH_COL_BITS)
/* Seeds per sketch row: a_0..a_4 and b of a multiply-shift hash
 * (sources.h source_cells). Fixed by the hash, not a limit: no override. */
#define TL_SEED_WORDS_N 6
#ifndef TL_SRC_TOP_ENTRIES
#define TL_SRC_TOP_ENTRIES 1024
#endif
/* The kernel LRU's LOCAL_FREE_TARGET: free entries a CPU takes at once
 * (source_top's sizing, maps.h). Fixed by the kernel: no override. */
#define TL_LRU_LOCAL_FREE 128

/* Most CPUs with a slot in the overflow map. A CPU numbered beyond it
 * counts every packet on the shared count (exact, without the fast path). */
#ifndef TL_MAX_CPUS
#define TL_MAX_CPUS 1024
#endif

/* A source sketch cell's count from which it is full (sources.h
 * sketch_add): 3 × 2^30, above tiers.MaxBudgetBytes (2^31). */
#define TL_CELL_FULL 0xC0000000U

/* The smooth shape's estimator (docs/design.md §9; tiers.SmoothFracBits,
 * SmoothMinFrac, SmoothOnsetMin, SmoothTickShift): fixed-point window
 * fractions, the least fraction the extrapolation divides by (1/32), the
 * least count that can latch an onset, and the tick when there is no jiffies
 * gate (the clock in ns >> 22, 4.19 ms). */
#define TL_SMOOTH_FRAC_BITS 16
#define TL_SMOOTH_ONE (1ULL << TL_SMOOTH_FRAC_BITS)
#define TL_SMOOTH_MIN_FRAC (TL_SMOOTH_ONE / 32)
#define TL_SMOOTH_ONSET_MIN 16
#define TL_SMOOTH_TICK_SHIFT 22
/* Ticks after a latch in which the recent rate is read from the clock
 * (tiers.SmoothClockTicks). */
#define TL_SMOOTH_CLOCK_TICKS 16
/* The fleet (docs/design.md §12): the most the others' sums are scaled by
 * in a member's onset (tiers.FleetRiseCap), and the most a sum the
 * program judges on may be (tiers.MaxFleetOthers). */
#define TL_FLEET_RISE_CAP 16ULL
#define TL_FLEET_OTHERS_MAX (1ULL << 46)
/* The most others the equal-share prior counts (tiers.fleetMembersMax). */
#define TL_FLEET_MEMBERS_MAX 65535ULL
/* The fleet's fallback with no agent (fleet.h; tiers.FleetMultMax,
 * FleetRhatMax): the largest multiplier on R̂, on 2^16 (a fallback max at
 * least table max ÷ 65536), and the largest R̂ it makes (2^47, below the
 * 2^48 that sm_beyond's product allows). */
#define TL_FLEET_MULT_SHIFT 32
#define TL_FLEET_RHAT_SHIFT 47
#define TL_FLEET_MULT_MAX (1ULL << TL_FLEET_MULT_SHIFT)
#define TL_FLEET_RHAT_MAX (1ULL << TL_FLEET_RHAT_SHIFT)
/* An onset's margin: the recent rate must pass S + S >> 2 (5/4 of S) to
 * latch (tiers.SmoothLatchShift). */
#define TL_SMOOTH_LATCH_SHIFT 2
/* The fractional bits of the part of a window the clock reads after a
 * latch (tiers.SmoothClockBits): el < 2^38 ns there (16 ticks). */
#define TL_SMOOTH_CLOCK_BITS 24
/* Samples of a window's in-budget count the smooth shape keeps with
 * budgets on (smooth_prof.h; tiers.SmoothProfN). */
#define TL_SMOOTH_PROF_N 16

/* The shed record (docs/design.md §10, record.h): the most bytes a sample keeps
 * of its frame (record.snaplen is at most this; tiers.RecordSnapMax
 * matches it), and the size of the ring buffer the samples go through, a
 * power of two of pages: 1 MiB holds about 3400 samples, 34 s of the
 * default 100/s, for an agent that falls behind. */
#ifndef TL_RECORD_SNAP_MAX
#define TL_RECORD_SNAP_MAX 256
#endif
#ifndef TL_RECORD_RING_BYTES
#define TL_RECORD_RING_BYTES (1 << 20)
#endif

#endif /* __TL_CONSTS_H */
