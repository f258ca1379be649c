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
/* The calls counted for tests (TL_COUNT_CALLS): before any helper call of
 * the headers that include this one. */
#include "calls.h"

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

/* Destination prefixes of select rules that have dests, tag = slot <<
 * TL_DEST_RULE_BITS: one entry per prefix, however many rules name it,
 * whose value has bit i set when rule i's dests hold the prefix's
 * addresses (tiers.Selectors.Dests: the rules of the shorter prefixes
 * that contain it too, so that the longest match answers for all). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, TL_DEST_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct tl_lpm_key);
	__type(value, __u32);
} select_dests SEC(".maps");

/* Per CPU: the last destination looked up in select_dests and its answer
 * (struct tl_dest_cache, policy.h dests_hold), so that a collector's
 * traffic, all to one address, pays the trie once per CPU and policy. The agent empties it
 * after it writes a slot's destinations and before it makes the slot
 * active (bpf.Limiter.ApplyContext): a tag names its slot, so an answer
 * cached for the active slot stays true until that slot is written again. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_dest_cache);
} dest_cache SEC(".maps");

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

/* The profiles of the current and the previous window's in-budget count,
 * with budgets on: struct tl_smooth_prof (smooth_prof.h). Written by the
 * first CPU to refresh in each step of a window, TL_SMOOTH_PROF_N times a
 * window at most; read once per tick and CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_smooth_prof);
} smooth_prof SEC(".maps");

/* Selected packets by [tier * TL_VERDICTS + verdict], per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, (TL_MAX_TIERS + 1) * TL_VERDICTS);
	__type(key, __u32);
	__type(value, struct tl_stat);
} stats SEC(".maps");

/* The L4 payload of selected packets by verdict, then of TCP segments
 * counted and never shed (enum tl_bytes_stat), per CPU: packets are
 * datagrams, bytes their payload (what the collector's socket receives). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_BYTES_STATS);
	__type(key, __u32);
	__type(value, struct tl_stat);
} bytes_stats SEC(".maps");

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
 * a u64 with the count in its low 32 bits and the window id above. A
 * global (.bss, 2 MiB), not a map of its own: the program addresses a cell
 * directly, where an array map's lookup is a helper call (inlined by the
 * verifier, but a call to the compiler, which spills what r1-r5 hold
 * around it) and a key on the stack, twice per selected packet with
 * budgets on (deploy/bench/hotpath.md, layout 6). A section's map is not
 * among the pinned maps (pinning.go pinnedName): each load starts its
 * sketch empty, and the agent of a restart copies the old program's into
 * it (Limiter.AdoptSketch, docs/design.md §11). */
__u64 tl_sketch[TL_SKETCH_ROWS * TL_SKETCH_COLS];

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

/* Sampled shed packets for the agent (record.h): struct tl_sample. A ring
 * buffer, not a perf event array: one buffer shared by all CPUs, so the
 * agent reads samples in the order they were taken and sizes one buffer,
 * not one per CPU (a flood on one CPU fills its own perf buffer while the
 * others idle); bpf_ringbuf_reserve hands out the record's memory, so the
 * frame's bytes are copied once, into place, with no stack buffer (a
 * sample outgrows the 512-byte stack's comfort) and no second copy by
 * bpf_perf_event_output. The cost of one shared reservation (a spinlock)
 * is paid only by sampled packets, at most record.samples per second.
 * Measured (bpf's BenchmarkRecordTransport, same run, against the perf
 * build below): a sample costs the program 73 ns through the ring, 200 ns
 * through a perf event array whose reader is woken every 64 samples
 * (2.7×), 5.4 µs with perf.NewReader's wakeup at every sample (73×:
 * the ring's submit wakes the reader only when it has caught up); reading
 * and decoding one costs the agent ~120 ns from the ring, 1.2–1.3× that
 * from perf. */
#ifndef TL_RECORD_PERF
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, TL_RECORD_RING_BYTES);
} shed_samples SEC(".maps");
#else
/* The measured alternative, built only for bpf's BenchmarkRecordTransport
 * (gen.go's third line, -DTL_RECORD_PERF; bindings behind the build tag
 * tlperf): shed_samples as a perf event array, one buffer per CPU (the
 * loader sizes it to the CPUs), written by bpf_perf_event_output from a
 * per-CPU scratch sample (record_scratch: a sample outgrows the stack),
 * the kernel appending the frame's bytes (BPF_F_CTX_LEN_MASK). The
 * constants are include/uapi/linux/bpf.h's. */
#define TL_MAP_PERF_EVENT_ARRAY 4
#define TL_F_CURRENT_CPU 0xffffffffULL
#define TL_F_CTX_LEN_SHIFT 32
struct {
	__uint(type, TL_MAP_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} shed_samples SEC(".maps");

/* The sample being built on this CPU (record.h tl_record). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_sample);
} record_scratch SEC(".maps");
#endif

/* The cap of samples, shared by all CPUs: struct tl_record_gate (record.h
 * record_token). Read by every shed packet, written only by those sampled. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_record_gate);
} record_gate SEC(".maps");

/* Each CPU's counts of samples written and lost: struct tl_record_cpu. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_record_cpu);
} record_cpu SEC(".maps");
/* Unclassified frames by enum tl_unclassified, per CPU: judged as
 * selected, and counted here as well. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_UNCL_MAX);
	__type(key, __u32);
	__type(value, struct tl_stat);
} unclassified_stats SEC(".maps");

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

/* The share of shed packets that may take a sample (record.h record_token),
 * on the bpf_get_prandom_u32() scale; TL_THR_ALWAYS (the value at load):
 * every one. The agent sets it each window to a few times record.samples
 * over the shed rate, so that the samples are a random draw of the shed
 * packets rather than the first after each of the gate's tokens, which
 * would favour a sender whose packets come first after a tick. */
volatile __u32 tl_record_share = TL_THR_ALWAYS;

/* The fleet (docs/design.md §12): the sums of the other members' last
 * reported R̂, packets per window, which the agent writes at each report
 * (bpf.Limiter.SetFleetOthers, each at most tiers.MaxFleetOthers = 2^46,
 * so that R̂ stays below the 2^48 that sm_beyond's product allows); 0
 * without a fleet, which is the plain smooth shape. tl_fleet_others_in is
 * the others' in-budget R̂, tl_fleet_others their total (in and over
 * budget), never less: smooth.h sm_judge adds the first to this member's
 * R̂_in, over_budget_thr the first to R̂_in and the second to R̂_tot.
 * Each is one aligned 8-byte store by the agent and one load here, but
 * the pair is two stores: a packet between them reads one new sum and one
 * old. The agent orders them so that the pair read is never torn into
 * in > total (the total first when it grows, else the in-budget sum
 * first): such a packet is judged as at a report in between, for the
 * microseconds between the stores. */
volatile __u64 tl_fleet_others_in;
volatile __u64 tl_fleet_others;

/* The fleet's first second (docs/design.md §12; fleet.h tl_fleet_others_now):
 * what the sums above answer, written by the agent with them
 * (bpf.Limiter.SetFleetOwn): this member's own R̂_in and R̂_tot at the
 * report, 2^48 over each (tiers.FleetRiseInv, 0 for 0), and the fleet's
 * member count the store returned, this member included. During its own
 * onset a member scales the sums by its rise since the report, or, idle
 * at it, judges the others at the equal-share prior; 0 members is the
 * plain fleet. The agent writes them before the sums: a packet between
 * the stores scales an old sum by a rise measured from the new report,
 * for the microseconds between them. */
volatile __u64 tl_fleet_own_in;
volatile __u64 tl_fleet_own;
volatile __u64 tl_fleet_inv_in;
volatile __u64 tl_fleet_inv;
volatile __u64 tl_fleet_members;

/* The judgement's arguments, from the entry point to tl_judge_tail across
 * the tail call (limiter.c judge_packed), per CPU: a tail call keeps no
 * register but ctx, and XDP runs a packet's programs on one CPU with
 * bottom halves off, so no other run of the program on that CPU comes
 * between the write and the read. (BPF_PROG_TEST_RUN only disables
 * migration: two threads test-running one limiter on one CPU could.) Not
 * pinned: it holds nothing past the packet. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_judge_args);
} tl_judge_args SEC(".maps");

/* The program array of the judgement's tail call: slot 0 holds
 * tl_judge_tail of the same object (the loader fills it from this
 * initializer). Never reused from the pin directory's maps (it would hold
 * an older load's program): the agent pins each load's beside its program
 * (agent/pin.Dir.PinProgram), as the kernel empties a program array when
 * its last holder closes it; empty, the entry point falls back to the
 * call of tl_judge. */
int tl_judge_tail(struct xdp_md *ctx);

/* Whether the entry point tail-calls the judgement (1) or calls tl_judge
 * (0). Package bpf loads with 0 where the kernel refuses a tail call in a
 * program with BPF-to-BPF calls (before Linux 6.0 on every JIT but
 * x86-64's, and with no JIT: kernel/bpf/verifier.c
 * allow_tail_call_in_subprogs): the tail call is then dead code, which the
 * verifier never checks. */
volatile const __u32 tl_judge_jump = 1;

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, int(struct xdp_md *));
} tl_jump SEC(".maps") = {
	.values = { [0] = (void *)&tl_judge_tail },
};

#endif /* __TL_MAPS_H */
