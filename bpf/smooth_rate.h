/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The smooth shape's recent rate and its latch (docs/design.md §9, the onset
 * from the recent rate; tiers/recent.go, model.Model.recent and .latch):
 * sm_recent reads the rate over a window from this CPU's reference (or, for
 * TL_SMOOTH_CLOCK_TICKS ticks after a latch, from the clock), sm_latch
 * latches and releases on it. sm_rate_ref, which moves the reference at a
 * refresh, stays with the refresh in smooth.h. */
#ifndef __TL_SMOOTH_RATE_H
#define __TL_SMOOTH_RATE_H

#include "maps.h"
#include "policy.h"
#include "window.h"

#include "smooth_q.h"
#include "fleet.h"

/* x − ref, or 0 when ref is past x: the rate's counts move down by a
 * window's at its end (sm_rate_ref), and may wrap (model.since). */
static __always_inline __u64 sm_since(__u64 x, __u64 ref)
{
	__u64 d = x - ref;
	return (__s64)d > 0 ? d : 0;
}

/* The rates of all selected packets (count a, *ea) and of the in-budget
 * packets of groups within their budget (count l, *el, with budgets on)
 * projected over a window, and the count of all since the reference
 * (model.Model.recent): in the TL_SMOOTH_CLOCK_TICKS ticks after a latch
 * from the clock since it (tiers.SmoothClockRate: the elapsed part of a
 * window on TL_SMOOTH_CLOCK_BITS bits, at least 2^-24 of it: 215 µs of an
 * hour's window, where 2^-16 was 55 ms; the live rate on one packet
 * fewer, tiers.SmoothClockLive: n − 1 over the time to the n-th), else per
 * tick since the reference (tiers.SmoothRecentMult). */
static __always_inline __u64 sm_recent(const struct tl_smooth_cpu *c, const struct tl_settings *s, __u64 a,
				       __u64 l, __u64 *ea, __u64 *el)
{
	__u64 ca;
	if (c->clock) {
		__u64 now = bpf_ktime_get_ns();
		__u64 el_ns = now > c->o_ns ? now - c->o_ns : 0;
		__u64 f = (el_ns << TL_SMOOTH_CLOCK_BITS) / (s->window_ns ? s->window_ns : 1);
		f = f ? f : 1;
		ca = sm_since(a, c->o_a);
		*ea = (ca << TL_SMOOTH_CLOCK_BITS) / f;
		if (s->src_budget) {
			__u64 cl = sm_since(l, c->o_m);
			*el = cl > 1 ? ((cl - 1) << TL_SMOOTH_CLOCK_BITS) / f : 0;
		}
		return ca;
	}
	ca = sm_since(a, c->ref_a);
	*ea = sm_mul(ca, c->k_rate);
	if (s->src_budget)
		*el = sm_mul(sm_since(l, c->ref_n), c->k_rate);
	return ca;
}

/* Updates this CPU's latch on the count of all selected packets a (this
 * packet's included) of window id at tick, with the live in-budget count
 * l, and returns E, the rate of all selected packets over a window (*el
 * the live in-budget one) (model.Model.latch, docs/design.md §9): an
 * onset is E past 5/4 of S and, latched, past twice the E it latched at
 * (a step on a step, or on a latch of noise; not the noise of a flood's
 * rate, which would keep it reading the clock); it latches, and the origin moves to this packet, so that the rate
 * after the step is read from the clock unmixed with the ticks before it.
 * Latched, E falling to S releases it. The window's onset is set for the
 * agent's estimate (tiers.Window), a plain store by any CPU that latches. */
static __always_inline __u64 sm_latch(struct tl_smooth_cpu *c, struct tl_window *w, const struct tl_settings *s,
				      __u64 id, __u64 a, __u64 l, __u64 *el)
{
	__u64 ea = 0;
	*el = 0;
	__u64 ca = sm_recent(c, s, a, l, &ea, el), least = tl_fleet_latch_least();
	__u64 st = a + c->base_tot;
	__u64 th = st + (st >> TL_SMOOTH_LATCH_SHIFT);
	if (th < 2 * c->lat)
		th = 2 * c->lat;
	if (ca >= least && ea > th) {
		c->lat = ea;
		c->o_tick = c->ref_tick = c->cand_tick = c->tick;
		c->o_ns = bpf_ktime_get_ns();
		c->o_a = c->ref_a = c->cand_a = a;
		c->o_m = c->ref_n = c->cand_n = l;
		c->clock = 1;
		if (READ_ONCE(w->onset) != id + 1)
			w->onset = id + 1;
	} else if (c->lat && ca >= least && ea <= st) {
		c->lat = 0;
	}
	return ea;
}

#endif /* __TL_SMOOTH_RATE_H */
