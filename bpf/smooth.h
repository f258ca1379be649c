/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The smooth shape (docs/design.md §9) and the over-budget packets' share of the
 * window (docs/design.md §6), in both shapes.
 *
 * Smooth drops each selected packet with probability q(R̂) = 1 − P(R̂)/R̂,
 * where R̂ estimates the window's offered count. tiers.SmoothCoef is the
 * same estimator in Go, and model.Model the reference the tests compare
 * against:
 *   S = n + base: the count over the last window's span (n, plus the
 *       previous window's count times the part of the span it covers);
 *   F = n × mult: n extrapolated to the window's end, mult = 1/max(f, 1/32);
 *   a window is an onset once F > 2 S with at least TL_SMOOTH_ONSET_MIN
 *   packets, latched in tl_window.onset; R̂ = max(S, F) in an onset, else S
 *   (sm_rhat: without budgets F is then read from the clock; with budgets
 *   the in-budget count is extrapolated by its recent rate).
 *
 * The per-tick parts (base, mult, the summed per-CPU counts, the in-budget
 * rate's reference) are computed by each CPU at its first packet of a tick
 * (jiffies, or the clock >> TL_SMOOTH_TICK_SHIFT), or of a new policy
 * slot, into its own smooth_cpu entry: a few divisions and one bpf_loop
 * over the CPUs per tick, and no write the CPUs share. A packet pays one
 * per-CPU lookup, two multiplications, a table lookup (or the memo of q
 * past the table) and a draw from the CPU's own generator; in an onset
 * window's first TL_SMOOTH_CLOCK_TICKS ticks without budgets, the clock
 * and two divisions more; an over-budget packet, its CPU's count and the
 * memo of its share. */
#ifndef __TL_SMOOTH_H
#define __TL_SMOOTH_H

#include "maps.h"
#include "policy.h"
#include "window.h"

#include "smooth_q.h"
#include "smooth_prof.h"

/* R̂ of count n under c: S, or max(S, F) in an onset (tiers.SmoothCoef.Estimate). */
static __always_inline __u64 sm_estimate(__u64 n, __u64 base, __u64 mult, int onset)
{
	__u64 s = n + base, f = sm_mul(n, mult);
	return onset && f > s ? f : s;
}

/* R̂ in an onset without budgets: max(S, F), F = x + n over the window's
 * elapsed fraction read from the clock (at least TL_SMOOTH_MIN_FRAC; x,
 * the exhausted groups' packets with budgets, is not extrapolated): the
 * per-tick F counts it in whole ticks, which a window of a few ticks
 * reads off by up to half a tick (tiers.SmoothOnsetF). Only the first
 * TL_SMOOTH_CLOCK_TICKS ticks of an onset window pay the clock and two
 * divisions per packet. */
static __always_inline __u64 sm_onset_f(struct tl_window *w, const struct tl_settings *s, __u64 n, __u64 x,
					__u64 sl)
{
	__u64 now = bpf_ktime_get_ns(), start = READ_ONCE(w->start_ns);
	__u64 el = now > start ? now - start : 0;
	__u64 f = (el << TL_SMOOTH_FRAC_BITS) / (s->window_ns ? s->window_ns : 1);
	if (f < TL_SMOOTH_MIN_FRAC)
		f = TL_SMOOTH_MIN_FRAC;
	if (f > TL_SMOOTH_ONE)
		f = TL_SMOOTH_ONE;
	__u64 fr = x + (n << TL_SMOOTH_FRAC_BITS) / f;
	return fr > sl ? fr : sl;
}

/* Whether count n under (base, mult) is an onset (tiers.SmoothCoef.Onset). */
static __always_inline int sm_onset(__u64 n, __u64 base, __u64 mult)
{
	return n >= TL_SMOOTH_ONSET_MIN && sm_mul(n, mult) > 2 * (n + base);
}

/* This CPU's own over-budget packets of window id (its overflow slot). */
static __always_inline __u64 sm_own_ex(__u64 id)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	return o && o->window[id & 1] == id ? o->ex[id & 1] : 0;
}

/* Whether a is within b/1024 of b (tiers.near). */
static __always_inline int sm_near(__u64 a, __u64 b)
{
	return (a > b ? a - b : b - a) <= b >> 10;
}

/* Starts c's in-budget rate reference again at start, the window's
 * start tick, when its ticks are of the other tick source: a restart
 * switched it (window.h window_start_tick), and the memo, pinned, is of
 * the same window from before the restart. Called from sm_coef with
 * budgets on. The start re-derived may move by a tick, hence the 1. A
 * global function, so that the verifier checks the branch once. */
__noinline int tl_sm_reref(struct tl_smooth_cpu *c, __u64 tick, __u64 start)
{
	if (!c || (c->cand_tick <= tick && c->ref_tick + 1 >= start))
		return 0;
	c->ref_tick = c->cand_tick = start;
	c->ref_n = c->cand_n = 0;
	return 1;
}

/* This CPU's estimate of window id at tick, refreshed when either changed
 * (model.Model.refresh). in is the window's shared in-budget count as the
 * caller read it. Returns NULL only if the per-CPU map cannot be read. */
static __noinline void sm_refresh(struct tl_smooth_cpu *c, struct tl_window *w, const struct tl_settings *s,
				  __u64 in, __u64 start);

static __always_inline struct tl_smooth_cpu *sm_coef(struct tl_window *w, const struct tl_settings *s, __u32 slot,
						     __u64 id, __u64 tick, __u64 in)
{
	__u32 zero = 0;
	struct tl_smooth_cpu *c = bpf_map_lookup_elem(&smooth_cpu, &zero);
	if (!c || (c->id == id + 1 && c->tick == tick && c->slot == slot))
		return c;
	/* Read here, not in sm_refresh, as are the global functions below:
	 * their frames then add to this caller's chain of stack frames, not
	 * to sm_refresh's (smooth_prof.h sm_prof_refresh says why). */
	__u64 start = window_start_tick(w, s, tick);
	if (c->id != id + 1) {
		/* This CPU's first refresh in the window: the in-budget rate
		 * is measured from the window's start (model.Model.refresh;
		 * tl_sm_reref, below, for a memo of the other tick source). */
		c->ref_tick = c->cand_tick = start;
		c->ref_n = c->cand_n = 0;
	}
	c->id = id + 1;
	c->tick = tick;
	c->slot = slot;
	if (s->src_budget)
		tl_sm_reref(c, tick, start);
	sm_refresh(c, w, s, in, start);
	if (s->src_budget)
		sm_prof_refresh(c, w, s, id, tick, in, start);
	return c;
}

/* The refresh of sm_coef, once per tick and CPU: a function of its own
 * (a BPF-to-BPF call), so that its locals (the bpf_loop sums) take no room
 * in the callers' stack frame, whose chain the verifier bounds at 512
 * bytes. */
static __noinline void sm_refresh(struct tl_smooth_cpu *c, struct tl_window *w, const struct tl_settings *s,
				  __u64 in, __u64 start)
{
	__u64 id = c->id - 1, tick = c->tick;
	__u64 j = s->sm_ticks ? s->sm_ticks : 1;
	__u64 e = tick > start ? tick - start : 0;
	if (e > j)
		e = j;
	__u64 f = ((2 * e + 1) << (TL_SMOOTH_FRAC_BITS - 1)) / j;
	if (f > TL_SMOOTH_ONE)
		f = TL_SMOOTH_ONE;
	__u64 gap = READ_ONCE(w->gap);
	__u64 g = (gap > j ? j : gap) << TL_SMOOTH_FRAC_BITS;
	g /= j;

	struct overflow_sum_ctx x = { .id = id };
	overflow_sums(&x, s->nr_cpus);
	__u64 prev_in = READ_ONCE(w->last_count) + x.prev;
	__u64 prev_tot = prev_in + READ_ONCE(w->prev_ex) + x.prev_ex;
	__u64 ov = f + g < TL_SMOOTH_ONE ? TL_SMOOTH_ONE - f - g : 0;

	c->hi_r = 0; /* the memo is of the slot's policy, and one tick old at most */
	c->rng = ((__u64)bpf_get_prandom_u32() << 32 | bpf_get_prandom_u32()) | 1;
	c->base_in = sm_mul(prev_in, ov);
	c->base_tot = sm_mul(prev_tot, ov);
	c->prev_in = sm_mul(prev_in, TL_SMOOTH_ONE - g);
	c->mult = (1ULL << (2 * TL_SMOOTH_FRAC_BITS)) / (f > TL_SMOOTH_MIN_FRAC ? f : TL_SMOOTH_MIN_FRAC);
	c->clock = e < TL_SMOOTH_CLOCK_TICKS;
	c->ovf = x.sum;
	c->ex = x.ex + READ_ONCE(w->ex_count);
	c->ex_own = sm_own_ex(id);
	c->ex_r = 0;
	if (s->src_budget) {
		/* The in-budget rate's reference (tiers.SmoothRateRef) and
		 * multiplier (tiers.SmoothState.RateMult). */
		/* Of the in-budget packets of groups that have not spent their
		 * budget (sm_in_estimate). */
		__u64 n = in + x.sum, xh = READ_ONCE(w->exh_in);
		/* S takes the previous window's share from its profile, and
		 * the refresh samples the window's own: sm_coef, after this
		 * (smooth_prof.h sm_prof_refresh). */
		c->prev_in_all = prev_in;
		n = n > xh ? n - xh : 0;
		__u64 d = j >> 4;
		if (tick >= c->cand_tick + (d ? d : 1)) {
			c->ref_tick = c->cand_tick;
			c->ref_n = c->cand_n;
			c->cand_tick = tick;
			c->cand_n = n;
		}
		__u64 dt = tick > c->ref_tick ? tick - c->ref_tick : 0;
		if (e >= j)
			c->k_in = 0;
		else if (dt >= e)
			c->k_in = c->mult - TL_SMOOTH_ONE;
		else
			c->k_in = ((2 * (j - e) - 1) << TL_SMOOTH_FRAC_BITS) / (2 * dt + 1);
	}
}

/* R̂ of the in-budget count n with budgets on (model.Model.inEstimate): S,
 * and in an onset the count extrapolated by its recent rate, when that is
 * more. Only the packets of groups still within their budget are
 * extrapolated, m = n − exh_in: a group that has spent its budget adds no
 * in-budget packet in this window (sources.h sketch_over), so its budget
 * counts once, as it is: x + m + (m − ref_n) × k_in, x = min(exh_in, n).
 * A flood's budget, spent in its first milliseconds, is thus not read as
 * a rate that sheds the light groups; a surge from many groups, each
 * within its budget, keeps its rate (none is exhausted). The window's
 * exh_in is read as it is (a shared add per exhausted group, no per-CPU
 * sum): a group exhausted on another CPU counts from the next packet. */
static __always_inline __u64 sm_in_estimate(struct tl_window *w, const struct tl_settings *st,
					      const struct tl_smooth_cpu *c, __u64 n, int onset)
{
	__u64 s = n + c->base_in;
	if (!onset)
		return s;
	__u64 x = READ_ONCE(w->exh_in);
	if (x > n)
		x = n;
	__u64 m = n - x;
	/* In the window's first ticks, the rate since it opened, from the
	 * clock, as without budgets (model.Model.inEstimate). */
	if (c->clock)
		return sm_onset_f(w, st, m, x, s);
	__u64 f = n + sm_mul(m > c->ref_n ? m - c->ref_n : 0, c->k_in);
	return f > s ? f : s;
}

/* A uniform 32-bit draw from this CPU's xorshift64* generator (Vigna,
 * "An experimental exploration of Marsaglia's xorshift generators", 2016:
 * the high 32 bits of the product pass BigCrush), reseeded from
 * bpf_get_prandom_u32 at each tick's refresh: the smooth shape draws for
 * nearly every packet of a flood, and this costs a few instructions where
 * the helper costs a call. */
static __always_inline __u32 sm_rand(struct tl_smooth_cpu *c)
{
	__u64 x = c->rng;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	c->rng = x;
	return (x * 0x2545F4914F6CDD1DULL) >> 32;
}

/* Whether a packet at threshold thr is dropped, drawing from c:
 * draw_drop with sm_rand for bpf_get_prandom_u32. */
static __always_inline int sm_drop(struct tl_smooth_cpu *c, __u32 thr)
{
	return thr != TL_THR_NEVER && (thr == TL_THR_ALWAYS || sm_rand(c) < thr);
}

/* The others' sum o a packet is judged on at own R̂ r (docs/design.md §12,
 * "The fleet's first second"; tiers.FleetOthersNow): o outside an onset;
 * in one, while own, this member's R̂ at the report o answers, is below
 * TL_SMOOTH_ONSET_MIN (it was idle), the equal-share prior
 * max(o, (members − 1) × r), members − 1 at most TL_FLEET_MEMBERS_MAX; else o scaled by the rise r/own, at most
 * TL_FLEET_RISE_CAP, with inv = 2^48/own from the agent (no division per
 * packet): (r − own) × inv >> 32 is the rise less one on 16 fractional
 * bits, below 2^20, and no product passes 2^64 for o ≤ 2^46 and r < 2^48.
 * At most TL_FLEET_OTHERS_MAX. 0 members (the agent has not written
 * them) is the plain fleet: o. A global function, so that the verifier
 * checks its branches once, not at each state of its three callers: on
 * Linux 6.18 the program's count went from 191,054 to 245,674 with it
 * inlined, 216,519 as a global (any one call of the two globals here
 * costs the 25,000, the rest nothing). Its frame, a few registers, adds
 * to the caller's chain beside sm_refresh's larger one. */
__noinline __u64 tl_fleet_others_now(__u64 o, __u64 r, __u64 own, __u64 inv, __u64 onset)
{
	__u64 m = tl_fleet_members;
	if (!onset || !m)
		return o;
	if (own < TL_SMOOTH_ONSET_MIN && m > 1) {
		m = m - 1 < TL_FLEET_MEMBERS_MAX ? m - 1 : TL_FLEET_MEMBERS_MAX;
		__u64 p = m * (r < TL_FLEET_OTHERS_MAX ? r : TL_FLEET_OTHERS_MAX);
		if (p > TL_FLEET_OTHERS_MAX)
			p = TL_FLEET_OTHERS_MAX;
		return p > o ? p : o;
	}
	if (!o || r <= own)
		return o;
	__u64 x;
	if (!own || r - own >= (TL_FLEET_RISE_CAP - 1) * own)
		x = o * TL_FLEET_RISE_CAP;
	else
		x = o + sm_mul_shr(o, ((r - own) * inv) >> 32, 16);
	return x < TL_FLEET_OTHERS_MAX ? x : TL_FLEET_OTHERS_MAX;
}

/* Whether count n below TL_SMOOTH_ONSET_MIN latches an onset on the
 * fleet's count (tiers.SmoothCoef.FleetOnset): n × members at least
 * TL_SMOOTH_ONSET_MIN, F over 2 S. A global function, as
 * tl_fleet_others_now. */
__noinline int tl_fleet_onset(__u64 n, __u64 base, __u64 mult)
{
	__u64 m = tl_fleet_members;
	return m > 1 && n && n < TL_SMOOTH_ONSET_MIN && n * m >= TL_SMOOTH_ONSET_MIN &&
	       sm_mul(n, mult) > 2 * (n + base);
}

/* R̂ of an in-budget packet whose count is n: the one place the program
 * forms the estimate an in-budget packet is judged by (model.Model.smooth).
 * With budgets, S or the in-budget count's recent rate (sm_in_estimate);
 * without, S, or in an onset max(S, F), F from the clock in the window's
 * first TL_SMOOTH_CLOCK_TICKS ticks (sm_onset_f).
 * Without budgets every selected packet is in budget: the previous
 * window's over-budget packets (a policy with budgets before a reload)
 * were offered too, so S takes all of them (base_tot). Over-budget
 * packets are judged on the estimates of over_budget_thr. */
static __always_inline __u64 sm_rhat(struct tl_window *w, const struct tl_settings *s, const struct tl_smooth_cpu *c,
				     __u64 n, int onset)
{
	if (s->src_budget)
		return sm_in_estimate(w, s, c, n, onset);
	if (onset && c->clock)
		return sm_onset_f(w, s, n, 0, n + c->base_tot);
	return sm_estimate(n, c->base_tot, c->mult, onset);
}

/* The smooth judgement of an in-budget packet whose window_count is pos:
 * its tier and q(R̂) (model.Model.smooth). Past saturation n is the shared
 * count, and the per-CPU counts summed at this CPU's tick are added. R̂ is
 * sm_rhat's; the onset is latched on all selected packets. The latch is a
 * plain store of one value by any CPU that sees the onset first. Returns
 * this CPU's estimate (for sm_drop), or NULL when a map cannot be read. */
static __always_inline struct tl_smooth_cpu *sm_judge(struct tl_window *w, const struct tl_settings *s,
						      __u32 slot, const struct window_pos *pos, __u32 *tier,
						      __u32 *thr)
{
	struct tl_smooth_cpu *c = sm_coef(w, s, slot, pos->id, pos->tick, pos->n);
	if (!c)
		return NULL;
	__u64 n = pos->n >= s->last_n ? pos->n + c->ovf : pos->n;
	int onset = READ_ONCE(w->onset) == pos->id + 1;
	if (!onset && (sm_onset(n + c->ex, c->base_tot, c->mult) || tl_fleet_onset(n + c->ex, c->base_tot, c->mult))) {
		w->onset = pos->id + 1;
		onset = 1;
	}
	__u64 rhat = sm_rhat(w, s, c, n, onset);
	/* the fleet's R̂_in (docs/design.md §12): the others' in-budget sum joins it */
	rhat += tl_fleet_others_now(tl_fleet_others_in, rhat, tl_fleet_own_in, tl_fleet_inv_in, onset);
	return sm_entry(s, slot, c, rhat, tier, thr) ? c : NULL;
}

/* The position and threshold of an over-budget packet of window id read at
 * tick (docs/design.md §6), counting it.
 *
 * Ordinal: position max(n, expect_in) + its rank among the window's
 * over-budget packets, where expect_in is the previous window's in-budget
 * count less the gap's share (model.Model.overBudget). The rank is a shared
 * add until the position reaches last_n; from there on every position is in
 * the table's last entry, so the packet is judged there without counting
 * its rank, and a one-source flood makes no shared write.
 *
 * Smooth: the packet counts itself in its CPU's overflow slot and is
 * judged on the live counts, per packet (model.Model.overSmooth): the
 * share of P(R̂_tot) − P(R̂_in), memoised per CPU (sm_share_memo).
 *
 * A super-packet of segs datagrams counts as segs over-budget packets and
 * takes its last datagram's position. */
static __always_inline int over_budget_thr(struct tl_window *w, const struct tl_settings *s, __u32 slot,
					   __u64 id, __u64 tick, __u32 segs, __u32 *thr)
{
	__u64 in = READ_ONCE(w->count);
	if (s->shape == TL_SHAPE_SMOOTH) {
		if (!overflow_add(w, id, 1, segs))
			__sync_fetch_and_add(&w->ex_count, segs);
		struct tl_smooth_cpu *c = sm_coef(w, s, slot, id, tick, in);
		if (!c)
			return 0;
		/* Judged per packet on the live counts: the window's in-budget
		 * count (with the per-CPU counts past saturation as summed at
		 * this CPU's tick), and the over-budget count summed at the
		 * tick plus what this CPU counted since. Saturated, the shared
		 * count stops at last_n - 1 (window_count: a packet that reads
		 * count + 1 >= last_n counts on its CPU's slot), so the test is
		 * window_count's own, not in >= last_n: with that, a window
		 * whose in-budget count passed max judged its over-budget
		 * packets on last_n - 1 in-budget packets, R̂_tot fell below
		 * R̂_in, and they passed at q(R̂_in) where the share is none
		 * (1.45 × P(R) passed, TestSmoothRiseProgram). */
		__u64 n = in + 1 >= s->last_n ? in + c->ovf : in;
		__u64 own = sm_own_ex(id);
		__u64 all = n + c->ex + (own > c->ex_own ? own - c->ex_own : 0);
		int onset = READ_ONCE(w->onset) == id + 1;
		if (!onset && (sm_onset(all, c->base_tot, c->mult) || tl_fleet_onset(all, c->base_tot, c->mult))) {
			w->onset = id + 1;
			onset = 1;
		}
		__u64 rtot = sm_estimate(all, c->base_tot, c->mult, onset);
		__u64 rin = n > c->prev_in ? n : c->prev_in;
		if (onset) {
			__u64 f = sm_in_estimate(w, s, c, n, 1);
			rin = f > rin ? f : rin;
		}
		/* The fleet's sums (docs/design.md §12, model.Model.overSmooth):
		 * the others' in-budget R̂ joins R̂_in, their total R̂_tot, so
		 * the fleet's over-budget packets share P(R_fleet) −
		 * P(R_fleet,in). */
		rin += tl_fleet_others_now(tl_fleet_others_in, rin, tl_fleet_own_in, tl_fleet_inv_in, onset);
		rtot += tl_fleet_others_now(tl_fleet_others, rtot, tl_fleet_own, tl_fleet_inv, onset);
		if (!c->ex_r || !sm_near(rtot, c->ex_r) || !sm_near(rin, c->ex_rin))
			sm_share_memo(c, s, slot, rin, rtot);
		*thr = c->ex_thr;
		return 1;
	}
	__u64 expect = READ_ONCE(w->expect_in);
	__u64 base = in > expect ? in : expect;
	__u64 pos = base + READ_ONCE(w->ex_count) + 1;
	__u32 tier;
	if (pos >= s->last_n) {
		/* Past T_last every position is the last entry's: no write at
		 * all (source_stats counts the packet; only the smooth shape
		 * reads the per-CPU over-budget counts). */
		*thr = s->last_thr;
		return 1;
	}
	pos = base + __sync_fetch_and_add(&w->ex_count, segs) + segs;
	return tier_entry(s, slot, pos, &tier, thr);
}

#endif /* __TL_SMOOTH_H */
