/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The overflow of a saturated window (docs/design.md §2): past the table's
 * end a CPU counts its packets in its own overflow slot instead of the
 * shared count, and the window's count is the shared count plus the slots'
 * sum (window.h window_count and window_open read them). */
#ifndef __TL_OVERFLOW_H
#define __TL_OVERFLOW_H

#include "maps.h"

/* tl_window.overflowed of a window that has closed: above every id + 1,
 * with the closed window's id + 1 in the low bits (window_open). */
#define TL_OVF_CLOSED (1ULL << 63)

/* Marks window id as overflowed: overflowed only moves forward, by
 * compare-and-swap from a value whose id part (the low bits) is below
 * id + 1. So a packet of an old window that marks late, after the opener
 * closed that window (TL_OVF_CLOSED with the old id), writes nothing: no
 * mark of an old window survives the opening. Once per window and CPU at
 * most (overflow_add), so the atomic costs nothing on the flood's path. */
static __always_inline void overflow_mark(struct tl_window *w, __u64 id)
{
	__u64 ov = READ_ONCE(w->overflowed);
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if ((ov & ~TL_OVF_CLOSED) >= id + 1)
			return;
		__u64 seen = __sync_val_compare_and_swap(&w->overflowed, ov, id + 1);
		if (seen == ov)
			return;
		ov = seen;
	}
}

/* Counts segs packets of window id on this CPU's overflow slot. Returns 0
 * when the CPU has no slot (numbered TL_MAX_CPUS or more): the caller
 * counts them on the shared count instead. Only this CPU writes its slot.
 * An in-budget packet (ex 0) gets, in *own when not NULL, the slot's count
 * after its add: what tl_overflow_own(id) reads next on this CPU, without
 * the call.
 * The first packet of a window on a CPU reuses the slot of window id - 2,
 * and marks the window as overflowed (overflow_mark). */
static __always_inline int overflow_add(struct tl_window *w, __u64 id, int ex, __u32 segs, __u64 *own)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	if (!o)
		return 0;
	__u32 i = id & 1;
	if (o->window[i] != id) {
		/* The counts are zeroed before the id is published, by an
		 * exchange (fully ordered), and readers read the id by a
		 * fetch-and-add of 0 before the counts (overflow_sum_cpu): no
		 * reader adds window id − 2's count to window id's
		 * (TestOverflowReuseModel). Once per window and CPU. */
		o->packets[i] = 0;
		o->ex[i] = 0;
		__sync_lock_test_and_set(&o->window[i], id);
	}
	if (ex) {
		o->ex[i] += segs;
		return 1;
	}
	if (!o->packets[i] && READ_ONCE(w->overflowed) != id + 1)
		overflow_mark(w, id);
	o->packets[i] += segs;
	if (own)
		*own = o->packets[i];
	return 1;
}

/* This CPU's own in-budget packets of window id past saturation: its
 * overflow slot's, which only this CPU writes (overflow_add). A global
 * function, so that the verifier checks it once: inlined at the smooth
 * judgement's call sites (smooth.h sm_ovf, sm_coef), it cost +76k
 * instructions. Its frame (the key) is smaller than sm_refresh's, beside
 * which it is called. */
__noinline __u64 tl_overflow_own(__u64 id)
{
	TL_FN(TL_OVERFLOW_OWN);
	__u32 cpu = bpf_get_smp_processor_id();
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	return o && o->window[id & 1] == id ? o->packets[id & 1] : 0;
}

/* bpf_loop's state for overflow_sum: the sums of window id's slots, and
 * of window id - 1's (the other slot) when prev is set. */
struct overflow_sum_ctx {
	__u64 id;
	__u64 sum;     /* in-budget packets past saturation, window id */
	__u64 ex;      /* over-budget packets, window id */
	__u64 prev;    /* the same two for window id - 1 */
	__u64 prev_ex;
};

static long overflow_sum_cpu(__u32 cpu, struct overflow_sum_ctx *x)
{
	TL_FN(OVERFLOW_SUM_CPU);
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	if (!o)
		return 1;
	__u32 i = x->id & 1;
	/* Each id is read fully ordered before its counts (overflow_add). */
	if (__sync_fetch_and_add(&o->window[i], 0) == x->id) {
		x->sum += o->packets[i];
		x->ex += o->ex[i];
	}
	if (__sync_fetch_and_add(&o->window[i ^ 1], 0) == x->id - 1) {
		x->prev += o->packets[i ^ 1];
		x->prev_ex += o->ex[i ^ 1];
	}
	return 0;
}

/* All four sums of overflow_sum_ctx for window id, over nr_cpus CPUs. */
static __always_inline void overflow_sums(struct overflow_sum_ctx *x, __u32 nr_cpus)
{
	bpf_loop(nr_cpus < TL_MAX_CPUS ? nr_cpus : TL_MAX_CPUS, overflow_sum_cpu, x, 0);
}

/* The packets of window id that the first nr_cpus CPUs counted in the
 * overflow map. bpf_loop (Linux >= 5.17), so that the verifier checks the
 * per-CPU step once instead of walking up to TL_MAX_CPUS iterations for
 * every state that reaches it. */
static __always_inline __u64 overflow_sum(__u64 id, __u32 nr_cpus)
{
	struct overflow_sum_ctx x = { .id = id };
	overflow_sums(&x, nr_cpus);
	return x.sum;
}

#endif /* __TL_OVERFLOW_H */
