/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The window shared by all CPUs (DESIGN.md §2): when a window expires, its
 * tick gate, the count of a selected packet with the overflow of a
 * saturated window, and the window id the sources' sketch counts under.
 * Every race accepted here is written next to the code that accepts it. */
#ifndef __TL_WINDOW_H
#define __TL_WINDOW_H

#include "maps.h"

/* Counts a packet of window id on this CPU's overflow slot. Returns 0 when
 * the CPU has no slot (numbered TL_MAX_CPUS or more): the caller counts it
 * on the shared count instead. Only this CPU writes its slot. The first
 * packet of a window on a CPU reuses the slot of window id - 2, and marks
 * the window as overflowed (a store to the shared line, once per window
 * unless CPUs race to it, all storing the same value). */
static __always_inline int overflow_add(struct tl_window *w, __u64 id, int ex)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	if (!o)
		return 0;
	__u32 i = id & 1;
	if (o->window[i] != id) {
		o->window[i] = id;
		o->packets[i] = 0;
		o->ex[i] = 0;
	}
	if (ex) {
		o->ex[i]++;
		return 1;
	}
	if (!o->packets[i] && READ_ONCE(w->overflowed) != id + 1)
		w->overflowed = id + 1;
	o->packets[i]++;
	return 1;
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
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	if (!o)
		return 1;
	__u32 i = x->id & 1;
	if (o->window[i] == x->id) {
		x->sum += o->packets[i];
		x->ex += o->ex[i];
	}
	if (o->window[i ^ 1] == x->id - 1) {
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

/* The clock reads window_expired made, for the opener's compare-and-swap. */
struct window_clock {
	__u64 jiffies; /* bpf_jiffies64, or 0 when the tick gate is off */
	__u64 now;     /* bpf_ktime_get_ns */
	__u64 start;   /* tl_window.start_ns as read before now's comparison */
};

/* The window rule, the one place it is written in C (tiers' model is the
 * Go one): the window has expired when more than window_ns passed since it
 * opened, on bpf_ktime_get_ns. The tick gate comes first (window_count
 * explains it): fewer than window_jiffies ticks since the window opened
 * means it has not expired, and the clock is not read (t->now and t->start
 * are then unset). */
static __always_inline int window_expired(struct tl_window *w, const struct tl_settings *s,
					  struct window_clock *t)
{
	t->jiffies = 0;
	if (s->window_jiffies) {
		t->jiffies = bpf_jiffies64();
		if (t->jiffies - READ_ONCE(w->start_jiffies) < s->window_jiffies)
			return 0;
	}
	t->now = bpf_ktime_get_ns();
	t->start = READ_ONCE(w->start_ns);
	return (__s64)(t->now - t->start) > (__s64)s->window_ns;
}

/* Counts a selected packet in the shared window and returns its n (1-based),
 * the window's id and the tick of the reading (window_count, below).
 *
 * The seed's rule: a window opens at the first selected packet that arrives
 * more than window_ns after the current window opened, on bpf_ktime_get_ns.
 * The CPU whose compare-and-swap moves start_ns opens it and resets the
 * count to 1.
 *
 * The tick gate: bpf_ktime_get_ns costs more than the whole parse, while
 * bpf_jiffies64 is one load. If fewer than window_jiffies ticks (window_ns
 * divided by the tick, rounded down) passed since the window opened, then
 * less than window_ns did and the window cannot have expired, so the clock
 * is not read. Only packets in a window's last tick read it, and the rule
 * stays exact to the nanosecond. start_jiffies is read before the clock, so
 * it never runs ahead of start_ns. If jiffies lag (a tickless CPU that has
 * not caught up yet), a window may open late by that lag; the agent sets
 * window_jiffies = 0, which disables the gate, where the tick is unknown.
 *
 * The saturated window: every packet with n >= last_n (the first n of the
 * table's last entry) is in the last entry, whatever its exact n. A packet
 * that reads count + 1 >= last_n therefore skips the atomic add: it counts
 * itself in its CPU's overflow slot for this window (no shared write, so
 * the window's cache line stays shared, read-mostly, on every CPU) and
 * takes n = count + 1, which is at least last_n and at most its true n.
 * The shared add is thus needed only for the first last_n packets of a
 * window, whatever the flood's rate. Below last_n, n stays exact: count
 * only grows within a window, so every packet that reads count + 1 >=
 * last_n comes after all packets whose add returned less. The window's
 * offered load is count plus the overflow of all CPUs for this window,
 * summed by the agent (bpf.Limiter.Window). A packet that takes the atomic
 * add in a window that has overflow (after a reload raised last_n) adds the
 * overflow of all CPUs to its n, so n stays exact across the reload. The
 * overflow then no longer grows (but for packets still judged by the old
 * policy in those microseconds), and every packet takes the add and that
 * sum, nr_cpus loads, until the shared count alone reaches the new last_n
 * or the window ends: the price of a reload that raises max mid-flood.
 *
 * Accepted race: between the opener's CAS on start_ns and its exchange of
 * count, another CPU may read the new start_ns and add to the old count; the
 * exchange then erases that increment, so the new window undercounts by the
 * packets other CPUs count in those few nanoseconds (at most one per other
 * CPU in practice). Those packets were judged at the old window's n, the
 * tier the offered load was in. start_jiffies, last_count and opened are
 * plain stores by the single opener; a CPU that reads a stale start_jiffies
 * only takes the exact path.
 *
 * The overflow count adds no loss of its own. A packet reads opened (the
 * window id), count and overflowed in that order; the opener clears
 * overflowed, exchanges count, then increments opened. So a packet that
 * reads the new id also reads the new window's count, and one that reads
 * the old window's saturated count files itself under the old id, where
 * the agent adds it to last_count; one that reads the new count also reads
 * the cleared overflowed, so it never adds the old window's overflow to its
 * n. One race remains: a packet that reads the old id but the new window's
 * count (between the exchange and the increment) and finds that count
 * already saturated, which only a policy with last_n <= 2 allows, files
 * itself under the old window, which then counts one packet per racing CPU
 * more and the new one as many fewer; its verdict is the last tier's
 * either way. These orders are x86's (loads in program order, stores in
 * program order); on arm64 the JIT does not order plain loads, and a packet
 * that sees them out of order is misfiled the same way, one per other CPU
 * per window opening at most.
 *
 * The opener also records what the smooth shape and the budgets that share
 * need of the window that ends (window_open): its start tick, the gap after
 * it, its in-budget count less the gap's share (expect_in), and its shared
 * over-budget count; all plain stores by the single opener, read by the
 * other CPUs without order: a CPU that reads one stale for the few ns after
 * the opening judges one packet on the old window's values. */
static __always_inline void window_open(struct tl_window *w, const struct tl_settings *s, __u64 tick,
					__u64 jiffies)
{
	__u64 old_tick = w->start_tick;
	__u64 first = w->opened == 0;
	w->start_jiffies = jiffies;
	w->start_tick = tick;
	w->overflowed = 0;
	__u64 prev = __sync_lock_test_and_set(&w->count, 1);
	w->last_count = prev;
	w->prev_ex = __sync_lock_test_and_set(&w->ex_count, 0);
	/* The previous window's end is its start plus a window; ticks beyond
	 * it are a gap, which weighs its count down (tiers.SmoothCoef.Prev). */
	__u64 j = s->sm_ticks ? s->sm_ticks : 1;
	__u64 end = old_tick + j;
	__u64 gap = first || tick <= end ? 0 : tick - end;
	if (gap > j)
		gap = j;
	w->gap = gap;
	w->expect_in = first ? 0 : prev * (j - gap) / j;
	w->opened++;
	/* A packet of the old window may still add to or pay the debt
	 * after this: it then counts in the new window (one per other
	 * CPU at most, in practice). */
	__sync_lock_test_and_set(&w->debt, 0);
}

/* The tick of a window_expired reading: jiffies under the tick gate, else
 * the clock >> TL_SMOOTH_TICK_SHIFT (window_expired reads the clock
 * whenever the gate is off). */
static __always_inline __u64 window_tick(const struct tl_settings *s, const struct window_clock *t)
{
	return s->window_jiffies ? t->jiffies : t->now >> TL_SMOOTH_TICK_SHIFT;
}

/* What window_count says of a packet. */
struct window_pos {
	__u64 n;    /* the packet's 1-based count in its window */
	__u64 id;   /* the window's id, tl_window.opened */
	__u64 tick; /* window_tick of the reading */
};

static __always_inline void window_count(struct tl_window *w, const struct tl_settings *s, struct window_pos *pos)
{
	struct window_clock t;

	int expired = window_expired(w, s, &t);
	pos->tick = window_tick(s, &t);
	if (expired && __sync_bool_compare_and_swap(&w->start_ns, t.start, t.now)) {
		window_open(w, s, pos->tick, t.jiffies);
		pos->n = 1;
		pos->id = w->opened;
		return;
	}
	__u64 id = READ_ONCE(w->opened);
	__u64 c = READ_ONCE(w->count);
	pos->id = id;
	if (c + 1 >= s->last_n && overflow_add(w, id, 0)) {
		pos->n = c + 1;
		return;
	}
	__u64 overflowed = READ_ONCE(w->overflowed);
	__u64 n = __sync_fetch_and_add(&w->count, 1) + 1;
	if (overflowed == id + 1 && n < s->last_n)
		n += overflow_sum(id, s->nr_cpus);
	pos->n = n;
}

/* The id of the window the packet will be counted in: tl_window.opened, or
 * one more when the window has expired and this packet (or a racing one)
 * is about to open the next; and the tick of the reading. It applies
 * window_count's rule (window_expired), so the two agree but for a packet
 * at a window's very end that a racing CPU moves into the next window
 * between the two reads: it is counted in the sketch under the old id
 * (accepted: one packet's share of a group's budget is charged to the
 * window that just ended). opened is bumped by the opener after start_ns,
 * so a CPU may pair the new start_ns with the old opened for a few ns:
 * same consequence. */
static __always_inline __u64 source_window(struct tl_window *w, const struct tl_settings *s, __u64 *tick)
{
	struct window_clock t;
	__u64 id = READ_ONCE(w->opened);
	int expired = window_expired(w, s, &t);
	*tick = window_tick(s, &t);
	return expired ? id + 1 : id;
}

#endif /* __TL_WINDOW_H */
