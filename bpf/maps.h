/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Every map of the tierlimit XDP program, one line above each saying what
 * it holds, and the globals the agent sets. Package bpf pins them by these
 * names (pinning.go). */
#ifndef __TL_MAPS_H
#define __TL_MAPS_H

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "consts.h"
#include "types.h"

/* A plain load the compiler may not merge or move: for map values that
 * other CPUs write. */
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))

/* The active policy slot: 0 or 1. The agent writes the other slot's settings,
 * table and selectors, then flips this with one map update. 0 and 1 differ in
 * one byte, so however the kernel copies the value, a packet reads either the
 * old slot or the new one. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} active_slot SEC(".maps");

/* struct tl_settings of each slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_SLOTS);
	__type(key, __u32);
	__type(value, struct tl_settings);
} settings SEC(".maps");

/* The compiled tier tables: slot s holds entries [s*TL_TABLE_MAX, s*TL_TABLE_MAX + table_len). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_SLOTS * TL_TABLE_MAX);
	__type(key, __u32);
	__type(value, struct tl_entry);
} tier_table SEC(".maps");

/* Port selectors: key (slot * 2 + is_tcp) * TL_PORT_KEYS + destination port. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_SLOTS * 2 * TL_PORT_KEYS);
	__type(key, __u32);
	__type(value, struct tl_port);
} ports SEC(".maps");

/* Exempt source prefixes, tag = slot. The value is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, TL_LPM_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct tl_lpm_key);
	__type(value, __u8);
} exempt_sources SEC(".maps");

/* Destination prefixes of select rules that have dests, tag = slot << TL_DEST_RULE_BITS | rule. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, TL_LPM_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct tl_lpm_key);
	__type(value, __u8);
} select_dests SEC(".maps");

/* The window shared by all CPUs: one struct tl_window. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_window);
} window SEC(".maps");

/* Packets of a saturated window counted per CPU, indexed by
 * bpf_get_smp_processor_id(): struct tl_overflow (window_count). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_MAX_CPUS);
	__type(key, __u32);
	__type(value, struct tl_overflow);
} overflow SEC(".maps");

/* Each CPU's smooth estimate of the current window, refreshed once per
 * tick: struct tl_smooth_cpu (smooth.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_smooth_cpu);
} smooth_cpu SEC(".maps");

/* Selected packets by [tier * TL_VERDICTS + verdict], per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, (TL_MAX_TIERS + 1) * TL_VERDICTS);
	__type(key, __u32);
	__type(value, struct tl_stat);
} stats SEC(".maps");

/* Packets that never enter the window, by enum tl_misc, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_MISC_MAX);
	__type(key, __u32);
	__type(value, struct tl_stat);
} misc_stats SEC(".maps");

/* Severity-aware shedding, per CPU: selected UDP packets by
 * [class * TL_VERDICTS + verdict], then enum tl_sev_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_SEV_STATS);
	__type(key, __u32);
	__type(value, struct tl_stat);
} severity_stats SEC(".maps");

/* Drop verdicts of recent first fragments, for their followers, with the
 * time they expire (TL_FRAG_TTL_MS after the first). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, TL_FRAG_ENTRIES);
	__type(key, struct tl_frag_key);
	__type(value, struct tl_frag_verdict);
} frag_verdicts SEC(".maps");

/* The count-min sketch of source groups: cell row * TL_SKETCH_COLS + column,
 * a u64 with the count in its low 32 bits and the window id above. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_SKETCH_ROWS * TL_SKETCH_COLS);
	__type(key, __u32);
	__type(value, __u64);
} source_sketch SEC(".maps");

/* Over-budget packets by verdict (pass in mode off), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_VERDICTS);
	__type(key, __u32);
	__type(value, struct tl_stat);
} source_stats SEC(".maps");

/* Source groups seen over budget, least recently over evicted first. A
 * flood's own packets write nothing here: each CPU counts its run of one
 * group in source_run and adds it at the run's end (source_top_add).
 *
 * Sized at load (bpf.sizeMaps): TL_SRC_TOP_ENTRIES + TL_LRU_LOCAL_FREE ×
 * (possible CPUs + 1). The kernel's common LRU hands free entries to each
 * CPU in batches of LOCAL_FREE_TARGET (128, kernel/bpf/bpf_lru_list.c)
 * and, when the shared free list runs out, evicts up to that many at once:
 * so up to 128 free entries sit with each CPU, and a table of exactly
 * TL_SRC_TOP_ENTRIES can evict while it holds as few as
 * TL_SRC_TOP_ENTRIES - 128 × (CPUs + 1) groups (none from 7 CPUs on).
 * With the slack, at least TL_SRC_TOP_ENTRIES groups stay, whatever the
 * CPU count; memory grows by about 20 KB per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, TL_SRC_TOP_ENTRIES);
	__type(key, struct tl_src_key);
	__type(value, struct tl_src_top);
} source_top SEC(".maps");

/* Per CPU: the run of over-budget packets of one group this CPU is in,
 * counted here and added to source_top when the run ends (source_top_add). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_src_run);
} source_run SEC(".maps");

/* Malformed frames by enum tl_malformed, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_MAL_MAX);
	__type(key, __u32);
	__type(value, struct tl_stat);
} malformed_stats SEC(".maps");

/* Interfaces (by ifindex) the program is attached to in generic (skb)
 * mode, where one frame can be a UDP GSO/GRO super-packet. The value is
 * unused. The agent writes it, and tl_skb_ifaces, after attaching. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TL_SKB_IFACES);
	__type(key, __u32);
	__type(value, __u8);
} skb_ifaces SEC(".maps");

/* Entries of skb_ifaces: 0 spares every packet the lookup. A global, so
 * that the selected path reads it with one load. */
volatile __u32 tl_skb_ifaces;

#endif /* __TL_MAPS_H */
