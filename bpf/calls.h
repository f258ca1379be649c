/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* What a packet pays in calls, for tests only (bpf TestHotPathCalls,
 * docs/design.md §2 "The selected path's calls"). Built with
 * -DTL_COUNT_CALLS (the limiterCalls object, gen.go), the program counts,
 * per CPU in tl_calls (enum tl_call): the packets it ran, the entries of
 * each BPF-to-BPF function (TL_FN at its top: each is a call and a
 * return), and the helper calls by kind, a map lookup by whether the
 * verifier inlines it (array and per-CPU array: a load, no call) or not.
 * The limiter itself is built without it: TL_FN is nothing, and no
 * helper is wrapped. */
#ifndef __TL_CALLS_H
#define __TL_CALLS_H

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"

#ifdef TL_COUNT_CALLS
/* The counters of tl_calls. Go reads the names from the object's BTF
 * (tl_call_btf), so the two sides share one list. */
enum tl_call {
	TL_CALL_PACKETS,
	/* BPF-to-BPF functions, by name */
	TL_CALL_TL_PARSE,
	TL_CALL_TL_JUDGE,
	TL_CALL_TL_JUDGE_TAIL, /* a tail call: a jump, no return */
	TL_CALL_TL_IPV6_OPTIONS,
	TL_CALL_TL_GSO_TCP,
	TL_CALL_TL_DODGY_SEGMENTS,
	TL_CALL_TL_UDP_REST6,
	TL_CALL_TL_DESTS_LOOKUP,
	TL_CALL_TL_HOST_DISCARDS,
	TL_CALL_TL_TICK_SWITCHED,
	TL_CALL_TL_OVERFLOW_OWN,
	TL_CALL_OVERFLOW_SUM_CPU,
	TL_CALL_SM_REFRESH,
	TL_CALL_SM_SHARE_MEMO,
	TL_CALL_SM_PROF_TAKE,
	TL_CALL_SM_PROF_SHARE,
	TL_CALL_TL_FLEET_SCALE,
	TL_CALL_TL_FLEET_OTHERS_NOW,
	TL_CALL_TL_RECORD,
	/* helpers */
	TL_CALL_H_KTIME_GET_NS,
	TL_CALL_H_GET_PRANDOM_U32,
	TL_CALL_H_JIFFIES64,
	TL_CALL_H_GET_SMP_PROCESSOR_ID,
	TL_CALL_H_LOOKUP_INLINED,
	TL_CALL_H_LOOKUP_CALLED,
	TL_CALL_H_MAP_UPDATE,
	TL_CALL_H_MAP_DELETE,
	TL_CALL_H_LOOP,
	TL_CALL_H_RINGBUF,
	TL_CALL_H_PERF_OUTPUT,
	TL_CALL_MAX,
};

/* The counters, per CPU: a test runs the program on one CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_CALL_MAX);
	__type(key, __u32);
	__type(value, __u64);
} tl_calls SEC(".maps");

/* Never read: puts enum tl_call in BTF for the test. */
const enum tl_call *tl_call_btf __attribute__((unused));

static __always_inline void tl_call_count(__u32 k)
{
	__u64 *v = bpf_map_lookup_elem(&tl_calls, &k);
	if (v)
		*v += 1;
}

#define TL_FN(name) tl_call_count(TL_CALL_##name)

/* The map type of a map definition (bpf_helpers.h __uint: an array of
 * that many ints), and whether the verifier inlines its lookups
 * (kernel/bpf/verifier.c do_misc_fixups, map_gen_lookup: array and
 * per-CPU array; a hash's gen_lookup still calls __htab_map_lookup_elem). */
#define TL_MAP_TYPE(m) (sizeof(*(m)->type) / sizeof(int))
#define TL_MAP_INLINED(m) (TL_MAP_TYPE(m) == BPF_MAP_TYPE_ARRAY || TL_MAP_TYPE(m) == BPF_MAP_TYPE_PERCPU_ARRAY)

#define bpf_map_lookup_elem(m, k)                                                                       \
	({                                                                                              \
		tl_call_count(TL_MAP_INLINED(m) ? TL_CALL_H_LOOKUP_INLINED : TL_CALL_H_LOOKUP_CALLED); \
		bpf_map_lookup_elem(m, k);                                                             \
	})
/* A lookup in a per-CPU array that the caller holds as void * (count).
 * (bpf_map_lookup_elem) is the helper itself: a function-like macro
 * expands only before a parenthesis. */
#define tl_lookup_percpu(m, k)                               \
	({                                                   \
		tl_call_count(TL_CALL_H_LOOKUP_INLINED);     \
		(bpf_map_lookup_elem)(m, k);                 \
	})
#define tl_counted(kind, call) ({ tl_call_count(TL_CALL_H_##kind); call; })
#define bpf_ktime_get_ns() tl_counted(KTIME_GET_NS, bpf_ktime_get_ns())
#define bpf_get_prandom_u32() tl_counted(GET_PRANDOM_U32, bpf_get_prandom_u32())
#define bpf_jiffies64() tl_counted(JIFFIES64, bpf_jiffies64())
#define bpf_get_smp_processor_id() tl_counted(GET_SMP_PROCESSOR_ID, bpf_get_smp_processor_id())
#define bpf_map_update_elem(m, k, v, f) tl_counted(MAP_UPDATE, bpf_map_update_elem(m, k, v, f))
#define bpf_map_delete_elem(m, k) tl_counted(MAP_DELETE, bpf_map_delete_elem(m, k))
#define bpf_loop(n, fn, ctx, f) tl_counted(LOOP, bpf_loop(n, fn, ctx, f))
#define bpf_ringbuf_reserve(m, s, f) tl_counted(RINGBUF, bpf_ringbuf_reserve(m, s, f))
#define bpf_ringbuf_submit(p, f) tl_counted(RINGBUF, bpf_ringbuf_submit(p, f))
#define bpf_perf_event_output(c, m, f, d, s) tl_counted(PERF_OUTPUT, bpf_perf_event_output(c, m, f, d, s))
#else
#define TL_FN(name) do { } while (0)
#define tl_lookup_percpu(m, k) bpf_map_lookup_elem(m, k)
#endif

#endif /* __TL_CALLS_H */
