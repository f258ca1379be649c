/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The smooth shape (docs/design.md §9) and the over-budget packets' share of the
 * window (docs/design.md §6), in both shapes.
 *
 * Smooth drops each selected packet with probability q(R̂) = 1 − P(R̂)/R̂,
 * where R̂ estimates the window's offered count. tiers (recent.go,
 * shape.go) holds the same rule in Go, and model.Model the reference the
 * tests compare against:
 *   S = n + base: the count over the last window's span (n, plus the
 *       previous window's count times the part of the span it covers);
 *   E = the recent rate over a window: the count since a reference D to
 *       2D ticks old (D = a sixteenth of the window) × 2j/(2dt + 1), or,
 *       in the TL_SMOOTH_CLOCK_TICKS ticks after a latch, the count
 *       since the latch over the part of a window since it, from the
 *       clock (sm_recent);
 *   an onset is a step in E: E past 5/4 of S and, latched, past twice
 *   the E it latched at, with TL_SMOOTH_ONSET_MIN packets since the
 *   reference. It latches per
 *   CPU (sm_latch), outlives the window, and releases once E falls to S;
 *   R̂ = max(S, E) while latched, else S (with budgets, the in-budget
 *   packets' S and the spent budgets plus the live groups' E).
 *
 * The per-tick parts (base, the summed per-CPU counts, the rate's
 * reference and multiplier) are computed by each CPU at its first packet
 * of a tick (jiffies, or the clock >> TL_SMOOTH_TICK_SHIFT), or of a new
 * policy slot, into its own smooth_cpu entry: a few divisions and one
 * bpf_loop over the CPUs per tick, and no write the CPUs share. A packet
 * pays one per-CPU lookup, two or three multiplications, a table lookup
 * (or the memo of q past the table) and a draw from the CPU's own
 * generator; in the first ticks after a latch, the clock and two or three
 * divisions more; an over-budget packet, its CPU's count and the memo of
 * its share. */
#ifndef __TL_SMOOTH_H
#define __TL_SMOOTH_H

#include "maps.h"
#include "policy.h"
#include "window.h"
#include "verdict.h"

#include "smooth_q.h"
#include "smooth_prof.h"
#include "smooth_rate.h"
#include "fleet.h"

/* This CPU's own over-budget packets of window id (its overflow slot). */
static __always_inline __u64 sm_own_ex(__u64 id)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	return o && o->window[id & 1] == id ? o->ex[id & 1] : 0;
}

/* The in-budget packets of window id counted per CPU past saturation, as
 * c counts them: the other CPUs' as summed at c's refresh (c->ovf), and
 * this CPU's own, live. So within a tick the count of a saturated window
 * grows with every packet of this CPU, as the model's does (issue 39: it
 * was frozen at the tick's first packet, and 10,000 packets in one tick
 * passed 1.7 to 4 × what the model passed:
 * TestSmoothSaturatedTickProgram);
 * the other CPUs' packets since c's refresh are not seen, a tick's worth
 * at most. own is this CPU's count as its packet's overflow_add left it
 * (window_pos.own), or TL_OWN_UNREAD: then it is read (tl_overflow_own, a
 * call), as on a packet that took the shared add. */
static __always_inline __u64 sm_ovf(const struct tl_smooth_cpu *c, __u64 id, __u64 own)
{
	return c->ovf + (own != TL_OWN_UNREAD ? own : tl_overflow_own(id));
}

/* Whether a is within b/1024 of b (tiers.near). */
static __always_inline int sm_near(__u64 a, __u64 b)
{
	return (a > b ? a - b : b - a) <= b >> 10;
}

/* The recent rate's reference at a refresh (model.Model.refresh): n is
 * the in-budget count (the per-CPU counts summed), prev_in and prev_tot
 * the previous window's final counts. At the window's first refresh the
 * counts move down by the previous window's (turn 1: in-budget ones
 * less the budgets spent at this CPU's last refresh), so that the rate is
 * measured across the boundary; a reference of an older window, another
 * tick source's (a restart: window.h window_start_tick), or a candidate
 * not refreshed for two spans (idle, or the CPU took no packet) starts
 * again at this tick, before this packet, and unlatched. */
static __always_inline void sm_rate_ref(struct tl_smooth_cpu *c, struct tl_window *w, const struct tl_settings *s,
					__u64 n, __u64 prev_in, __u64 prev_tot)
{
	__u64 tick = c->tick, j = s->sm_ticks ? s->sm_ticks : 1;
	__u64 xh = READ_ONCE(w->exh_in);
	__u64 a = n + c->ex, l = n > xh ? n - xh : 0;
	if (c->turn == 1) {
		__u64 dl = prev_in > c->xh ? prev_in - c->xh : 0;
		c->ref_a -= prev_tot;
		c->cand_a -= prev_tot;
		c->o_a -= prev_tot;
		c->ref_n -= dl;
		c->cand_n -= dl;
		c->o_m -= dl;
	}
	__u64 d = j >> 4;
	d = d ? d : 1;
	if (c->turn == 2 || tick < c->cand_tick || tick >= c->cand_tick + 2 * d) {
		c->ref_tick = c->cand_tick = tick;
		c->ref_a = c->cand_a = a ? a - 1 : 0;
		c->ref_n = c->cand_n = l ? l - 1 : 0;
		c->lat = 0; /* a latch of this CPU's older traffic: the rate starts again */
	} else if (tick >= c->cand_tick + d) {
		c->ref_tick = c->cand_tick;
		c->ref_n = c->cand_n;
		c->ref_a = c->cand_a;
		c->cand_tick = tick;
		c->cand_n = l;
		c->cand_a = a;
	}
	c->turn = 0;
	c->xh = xh;
	c->k_rate = (2 * j << TL_SMOOTH_FRAC_BITS) / (2 * (tick - c->ref_tick) + 1);
	c->clock = c->lat && tick >= c->o_tick && tick - c->o_tick < TL_SMOOTH_CLOCK_TICKS;
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
	/* This CPU's first refresh in the window: the rate's counts move
	 * down by the previous window's (turn 1), or, of an older window,
	 * start again (turn 2; sm_refresh). */
	if (c->id != id + 1)
		c->turn = c->id == id ? 1 : 2;
	c->id = id + 1;
	c->tick = tick;
	c->slot = slot;
	sm_refresh(c, w, s, in, start);
	fleet_refresh(); /* whether the fleet's view expired (fleet.h) */
	if (s->src_budget)
		sm_prof_refresh(c, w, s, id, tick, in, start);
	/* From here on c->ovf is the other CPUs' (sm_ovf); the profile took all. */
	__u64 own = tl_overflow_own(id);
	c->ovf = c->ovf > own ? c->ovf - own : 0;
	return c;
}

/* The refresh of sm_coef, once per tick and CPU: a function of its own
 * (a BPF-to-BPF call), so that its locals (the bpf_loop sums) take no room
 * in the callers' stack frame, whose chain the verifier bounds at 512
 * bytes. */
static __noinline void sm_refresh(struct tl_smooth_cpu *c, struct tl_window *w, const struct tl_settings *s,
				  __u64 in, __u64 start)
{
	TL_FN(SM_REFRESH);
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
	c->ovf = x.sum;
	c->ex = x.ex + READ_ONCE(w->ex_count);
	c->ex_own = sm_own_ex(id);
	c->ex_r = 0;
	if (s->src_budget) {
		/* S takes the previous window's share from its profile, and
		 * the refresh samples the window's own: sm_coef, after this
		 * (smooth_prof.h sm_prof_refresh). */
		c->prev_in_all = prev_in;
	}
	sm_rate_ref(c, w, s, in + x.sum, prev_in, prev_tot);
}


/* R̂ of the in-budget count n with budgets on (model.Model.inEstimate): S,
 * and while latched x + el, when that is more, where el is the rate of the
 * packets of groups still within their budget over a window (sm_latch)
 * and x = min(exh_in, n): a group that has spent its budget adds no
 * in-budget packet in this window (sources.h sketch_over), so its budget
 * counts once, as it is. A flood's budget, spent in its first
 * milliseconds, is thus not read as a rate that sheds the light groups; a
 * surge from many groups, each within its budget, keeps its rate (none is
 * exhausted). The window's exh_in is read as it is (a shared add per
 * exhausted group, no per-CPU sum): a group exhausted on another CPU
 * counts from the next packet. */
static __always_inline __u64 sm_in_estimate(struct tl_window *w, const struct tl_smooth_cpu *c, __u64 n, __u64 el)
{
	__u64 s = n + c->base_in;
	if (!c->lat)
		return s;
	__u64 x = READ_ONCE(w->exh_in);
	if (x > n)
		x = n;
	x += el;
	return x > s ? x : s;
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

/* R̂ of an in-budget packet whose count is n: the one place the program
 * forms the estimate an in-budget packet is judged by (model.Model.smooth),
 * given E (ea) and the live in-budget rate (el) of sm_latch. With
 * budgets, sm_in_estimate; without, S, or max(S, E) while latched.
 * Without budgets every selected packet is in budget: the previous
 * window's over-budget packets (a policy with budgets before a reload)
 * were offered too, so S takes all of them (base_tot). Over-budget
 * packets are judged on the estimates of over_budget_thr. */
static __always_inline __u64 sm_rhat(struct tl_window *w, const struct tl_settings *s, const struct tl_smooth_cpu *c,
				     __u64 n, __u64 ea, __u64 el)
{
	if (s->src_budget)
		return sm_in_estimate(w, c, n, el);
	__u64 st = n + c->base_tot;
	return c->lat && ea > st ? ea : st;
}

/* The smooth judgement of an in-budget packet whose window_count is pos:
 * its tier and q(R̂) (model.Model.smooth). Past saturation n is the shared
 * count, and the per-CPU counts summed at this CPU's tick are added. R̂ is
 * sm_rhat's; the onset is latched, per CPU, on the rate of all selected
 * packets (sm_latch), the live in-budget ones being the count less the
 * spent budgets (exh_in). Returns
 * this CPU's estimate (for sm_drop), or NULL when a map cannot be read. */
static __always_inline struct tl_smooth_cpu *sm_judge(struct tl_window *w, const struct tl_settings *s,
						      __u32 slot, const struct window_pos *pos, __u32 *tier,
						      __u32 *thr)
{
	struct tl_smooth_cpu *c = sm_coef(w, s, slot, pos->id, pos->tick, pos->n);
	if (!c)
		return NULL;
	__u64 n = pos->n >= s->last_n ? pos->n - 1 + sm_ovf(c, pos->id, pos->own) : pos->n;
	__u64 xh = READ_ONCE(w->exh_in), el;
	__u64 ea = sm_latch(c, w, s, pos->id, n + c->ex, n > xh ? n - xh : 0, &el);
	__u64 rhat = sm_rhat(w, s, c, n, ea, el);
	/* the fleet's R̂_in (docs/design.md §12): the others' in-budget sum
	 * joins it, scaled by this member's rise while it is latched, or past
	 * the view's expiry the fallback (fleet.h) */
	rhat = tl_fleet_rhat(rhat, 0, c->lat != 0);
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
 * takes its last datagram's position.
 *
 * *drop is whether the policy drops the packet at *thr (never in mode
 * off): the draw, from this CPU's generator in the smooth shape (sm_drop,
 * no helper call), else bpf_get_prandom_u32 (draw_drop). Returns 0 when
 * there is no threshold to read (a map that cannot be read): the caller
 * judges the packet at TL_THR_ALWAYS. */
static __always_inline int over_budget_thr(struct tl_window *w, const struct tl_settings *s, __u32 slot,
					   __u64 id, __u64 tick, __u32 segs, __u32 *thr, int *drop)
{
	__u64 in = READ_ONCE(w->count);
	if (s->shape == TL_SHAPE_SMOOTH) {
		if (!overflow_add(w, id, 1, segs, NULL))
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
		__u64 n = in + 1 >= s->last_n ? in + sm_ovf(c, id, TL_OWN_UNREAD) : in;
		__u64 own = sm_own_ex(id);
		__u64 all = n + c->ex + (own > c->ex_own ? own - c->ex_own : 0);
		__u64 xh = READ_ONCE(w->exh_in), el;
		__u64 ea = sm_latch(c, w, s, id, all, n > xh ? n - xh : 0, &el);
		__u64 rtot = all + c->base_tot;
		__u64 rin = n > c->prev_in ? n : c->prev_in;
		if (c->lat) {
			__u64 f = sm_in_estimate(w, c, n, el);
			rtot = ea > rtot ? ea : rtot;
			rin = f > rin ? f : rin;
		}
		/* The fleet's sums (docs/design.md §12, model.Model.overSmooth):
		 * the others' in-budget R̂ joins R̂_in, their total R̂_tot, so
		 * the fleet's over-budget packets share P(R_fleet) −
		 * P(R_fleet,in), each scaled by this member's rise while it is
		 * latched (fleet.h tl_fleet_others_now); past the view's expiry
		 * both at the fallback's multiplier, unscaled. */
		rin = tl_fleet_rhat(rin, 0, c->lat != 0);
		rtot = tl_fleet_rhat(rtot, 1, c->lat != 0);
		if (!c->ex_r || !sm_near(rtot, c->ex_r) || !sm_near(rin, c->ex_rin))
			sm_share_memo(c, s, slot, rin, rtot);
		*thr = c->ex_thr;
		/* The draw from this CPU's generator (sm_drop), not the
		 * helper's: no call. */
		*drop = s->mode != TL_MODE_OFF && sm_drop(c, c->ex_thr);
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
		*drop = s->mode != TL_MODE_OFF && draw_drop(*thr);
		return 1;
	}
	pos = base + __sync_fetch_and_add(&w->ex_count, segs) + segs;
	if (!tier_entry(s, slot, pos, &tier, thr))
		return 0;
	*drop = s->mode != TL_MODE_OFF && draw_drop(*thr);
	return 1;
}

#endif /* __TL_SMOOTH_H */
