/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The window shared by all CPUs (docs/design.md §2): when a window expires, its
 * tick gate, the count of a selected packet with the overflow of a
 * saturated window, and the window id the sources' sketch counts under.
 * Every race accepted here is written next to the code that accepts it. */
#ifndef __TL_WINDOW_H
#define __TL_WINDOW_H

#include "maps.h"

#include "overflow.h"

/* The clock reads window_expired made, for the opener's compare-and-swap. */
struct window_clock {
	__u64 jiffies; /* bpf_jiffies64, or 0 when the tick gate is off */
	__u64 now;     /* bpf_ktime_get_ns */
	__u64 start;   /* tl_window.start_ns as read before now's comparison */
};

/* The tick of start_ns (a window's start, on the clock) in the tick
 * source of settings whose window_ns and window_jiffies these are, where
 * the window recorded its start tick in the other source
 * (window_start_tick): start_ns >> TL_SMOOTH_TICK_SHIFT under the clock;
 * under the gate, tick (jiffies at clock now; now 0: read it here) less
 * the whole ticks since start_ns, of window_ns / window_jiffies each (the
 * tick, rounded up to divide a window). A global function, so that the
 * verifier checks it once: it runs only in the window in progress at a
 * restart that switched the source. */
__noinline __u64 tl_tick_switched(__u64 window_ns, __u64 window_jiffies, __u64 tick, __u64 now, __u64 start_ns)
{
	if (!window_jiffies)
		return start_ns >> TL_SMOOTH_TICK_SHIFT;
	if (!now)
		now = bpf_ktime_get_ns();
	__u64 per = window_ns / window_jiffies;
	__u64 e = now > start_ns ? (now - start_ns) / (per ? per : 1) : 0;
	return tick > e ? tick - e : 0;
}

/* The window's start tick in the tick source s reads (window_tick), which
 * a restart may have switched (the agent measured the tick this time and
 * not the last, or the reverse: bpf.Options.TickNs). The window records
 * its start tick's source: start_jiffies is 0 exactly when it opened under
 * the clock, as bpf_jiffies64 never reads 0 (it starts at INITIAL_JIFFIES,
 * 2^32 less 300 s of ticks). A start tick of the other source is
 * re-derived (tl_tick_switched, docs/design.md §9): a branch on the rare
 * path, as the start tick is read once per tick and CPU. */
static __always_inline __u64 window_start_tick(const struct tl_window *w, const struct tl_settings *s, __u64 tick)
{
	__u64 start = READ_ONCE(w->start_tick);
	if (!READ_ONCE(w->start_jiffies) != !s->window_jiffies)
		start = tl_tick_switched(s->window_ns, s->window_jiffies, tick, 0, READ_ONCE(w->start_ns));
	return start;
}

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
 * tier the offered load was in. start_jiffies and the fields below are
 * plain stores by the single opener; a CPU that reads a stale
 * start_jiffies only takes the exact path.
 *
 * Ordering, on any architecture: the opener's writes that others must see
 * in order are BPF atomics with a fetch (xchg, cmpxchg, fetch_add), which
 * are fully ordered (Documentation/bpf/standardization: BPF_FETCH; the
 * arm64 JIT emits them as acquire-release LSE atomics or LL/SC between
 * barriers). The opener closes the old window's mark (overflowed =
 * TL_OVF_CLOSED | old id + 1, xchg), then increments opened (fetch_add),
 * then exchanges count, the last two back to back (issue 39: the id
 * before the count, so that no packet reads a reset count with the old
 * id; TestWindowGapModel). An exact-path packet reads opened and
 * overflowed only after its own fetch_add on count, which is ordered
 * after or before the opener's exchange in count's single modification
 * order:
 *  - after: its loads follow the close and the increment, so it reads
 *    the new id, and overflowed is the closed mark or a mark of the new
 *    window (overflow_mark never moves it back), which matches id + 1
 *    only as the new window's: it adds the new window's overflow to the
 *    new window's n, or nothing;
 *  - before: its count is the old window's; it adds the old window's
 *    overflow when it reads the old id and mark, or nothing, unless it
 *    reads the new id and the new window is marked by then: a packet of
 *    the saturated path misfiled under it (below), or the new window
 *    saturated (last_n - 1 packets) between the opener's exchange and
 *    this packet's next load, which only last_n <= 2 allows; it then adds
 *    what the new window holds: the misfiled packets, one per other CPU.
 *    A packet whose add falls between the increment and the exchange
 *    reads the new id with the old window's count: it is judged in the
 *    new window on a count at least its true one (at most one per other
 *    CPU, in the few ns between two atomics; TestWindowGapProgram).
 * So no packet adds the old window's overflow to the new window's n, and
 * a packet of the old window adds at most the new window's first few,
 * whatever the loads' order. TestWindowOrderModel enumerates the
 * interleavings, with plain loads and stores reordered between atomics,
 * of this protocol and of the one it replaced, which fails.
 * The saturated path reads count and opened as plain loads, in either
 * order: a packet that reads the old saturated count with the new id files
 * itself (and marks) under the new window, which then counts it: one
 * packet per other CPU per opening, whose verdict is the last tier's
 * either way, as a reading of the old id with the new count (last_n <= 2)
 * files one under the old window. A reset count (below last_n) sends the
 * packet to the exact path, which reads the id after its add: the new id.
 *
 * The opener also records what the smooth shape and the budgets that share
 * need of the window that ends (window_open): its start tick, the gap after
 * it, its in-budget count less the gap's share (expect_in), and its shared
 * over-budget count; all plain stores by the single opener before it
 * increments opened, so that a CPU that reads the new id refreshes on
 * them (last_count is the count read before the increment, corrected by
 * the exchange's for the packets counted between the two); a CPU that
 * reads one early, with the old id, judges one packet on the new values. */
static __always_inline void window_open(struct tl_window *w, const struct tl_settings *s, __u64 tick,
					const struct window_clock *t, __u32 wt)
{
	__u64 old_tick = w->start_tick;
	/* The old window opened under the other tick source (a restart
	 * switched it: window_start_tick). */
	if (!w->start_jiffies != !s->window_jiffies)
		old_tick = tl_tick_switched(s->window_ns, s->window_jiffies, tick, t->now, t->start);
	__u64 id = w->opened;
	w->start_jiffies = t->jiffies;
	w->start_tick = tick;
	__u64 ov = __sync_lock_test_and_set(&w->overflowed, TL_OVF_CLOSED | (id + 1));
	/* The old window's count so far: the exchange below, after the id
	 * moved, takes the last few packets into last_count. */
	__u64 pre = __sync_fetch_and_add(&w->count, 0);
	w->last_count = pre;
	/* The ordinal budgets' expectation takes the window's true count, its
	 * CPUs' overflow included, as model.Model does (once per window). */
	__u64 all = pre;
	if (ov == id + 1)
		all += overflow_sum(id, s->nr_cpus);
	w->prev_ex = __sync_lock_test_and_set(&w->ex_count, 0);
	/* A group that spends its budget in the old window and adds to
	 * exh_in after this store counts in the new window (a budget too
	 * much, one per other CPU at most); one of the new window that adds
	 * before it is lost, and its in-budget packets are extrapolated as
	 * any others' (sm_in_estimate). */
	w->exh_in = 0;
	/* The previous window's end is its start plus a window; ticks beyond
	 * it are a gap, which weighs its count down (tiers.SmoothCoef.Prev). */
	__u64 j = s->sm_ticks ? s->sm_ticks : 1;
	__u64 end = old_tick + j;
	__u64 gap = !id || tick <= end ? 0 : tick - end;
	if (gap > j)
		gap = j;
	w->gap = gap;
	w->expect_in = !id ? 0 : all * (j - gap) / j;
	/* The id moves before the count is reset, the two atomics back to
	 * back (issue 39 item 4, window_open's gap): a packet that reads the
	 * reset count reads the new id (window_count), so none is judged on
	 * a reset count with the old id. When the count was reset first and
	 * the id moved after the overflow sum and the stores above, every
	 * smooth packet of that gap on another CPU was judged on a count of
	 * 1 with the old window's estimate, and passed
	 * (TestWindowGapProgram, TestWindowGapModel). */
	__sync_fetch_and_add(&w->opened, 1);
	__u64 prev = __sync_lock_test_and_set(&w->count, wt);
	if (prev != pre)
		w->last_count = prev;
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

static __always_inline void window_count(struct tl_window *w, const struct tl_settings *s, struct window_pos *pos,
					 __u32 wt)
{
	struct window_clock t;

	int expired = window_expired(w, s, &t);
	pos->tick = window_tick(s, &t);
	if (expired && __sync_bool_compare_and_swap(&w->start_ns, t.start, t.now)) {
		/* The opener's whole weight (a super-packet's datagrams, or its
		 * bytes) opens the new window's count. */
		window_open(w, s, pos->tick, &t, wt);
		pos->n = wt;
		pos->id = READ_ONCE(w->opened);
		return;
	}
	__u64 c = READ_ONCE(w->count);
	__u64 id = READ_ONCE(w->opened);
	pos->id = id;
	if (c + 1 >= s->last_n && overflow_add(w, id, 0, wt)) {
		/* c + 1 >= last_n: the last entry's, whatever the weight (a
		 * SYN's 0 under count: bytes too); the smooth shape adds the
		 * overflow, this packet's included, to c (smooth.h sm_judge). */
		pos->n = c + 1;
		return;
	}
	__u64 n = __sync_fetch_and_add(&w->count, wt) + wt;
	/* After the fetch_add, which orders them (above). */
	id = READ_ONCE(w->opened);
	pos->id = id;
	if (READ_ONCE(w->overflowed) == id + 1 && n < s->last_n)
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
