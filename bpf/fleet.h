/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The fleet's view and its expiry (docs/design.md §12, "A view that
 * expires"): the others' sums the agent writes (maps.h tl_fleet_others_in,
 * tl_fleet_others) hold until tl_fleet_expiry; past it the program judges
 * alone on the fallback, with no agent running: the others' sums are 0
 * and R̂ is judged at tl_fleet_fb_mult times itself.
 *
 * Why a multiplier: the tiers are percents of max, so the table for a
 * max M/k judged at R̂ is the table for M judged at k·R̂, scaled:
 * P_{M/k}(R) = P_M(k·R)/k, q_{M/k}(R) = q_M(k·R), up to each threshold's
 * rounding to a whole packet (tiers.FleetFallbackMult, checked against
 * tiers.Compile in tiers/fleetview_test.go). So the fallback's max is one
 * number the agent writes with each policy, k = table max ÷ fallback max
 * on 2^16, and the program needs no second table. An over-budget packet's
 * share (P(k·R̂_tot) − P(k·R̂_in)) / (k·R̂_tot − k·R̂_in) is the fallback
 * max's share too.
 *
 * Whether the view expired is decided once per tick and CPU, at the
 * smooth refresh (fleet_refresh, from sm_coef), not per packet: it reads
 * the clock there, and writes tl_fleet_stale only when it changes, so a
 * packet pays one load of a line no CPU writes in the steady state. The
 * fallback so starts within one tick of the expiry. Past it a packet
 * pays a call (tl_fleet_scale, a global function: an inline one split the
 * verifier's paths further); with the view, one load and a branch. The
 * branch costs the verifier 27,700 instructions (218,784 on 6.18, from
 * 191,054). The agent writes the
 * sums, then the expiry, then clears tl_fleet_stale; a CPU that read the
 * old expiry just before may set it again, until its next tick's refresh:
 * such packets are judged on the fallback for at most a tick after a
 * report (a race accepted: it sheds more, never less). */
#ifndef __TL_FLEET_H
#define __TL_FLEET_H

#include "maps.h"
#include "smooth_q.h"

/* The bpf_ktime_get_ns (CLOCK_MONOTONIC) until which the sums hold,
 * written by the agent (bpf.Limiter.SetFleetView): at each report
 * answered, its answer's time + ttl; 0 (expired) when it applies a fleet
 * policy before its first report, so that a program a new agent loads
 * judges on the fallback until that report, never on a view it has not
 * read, and when it leaves the fleet. ~0 (the value at load, and without a
 * fleet) never expires. */
volatile __u64 tl_fleet_expiry = ~0ULL;

/* The fallback's multiplier on R̂, on 2^16 (TL_SMOOTH_ONE: none): the
 * table max over the fallback's max, which the agent writes with each
 * policy it applies (bpf.Limiter.SetFleetFallback). At most
 * TL_FLEET_MULT_MAX. */
volatile __u64 tl_fleet_fb_mult = TL_SMOOTH_ONE;

/* 1 while the view has expired, as the last refresh of any CPU saw it:
 * written by the program (fleet_refresh) and by the agent with a new
 * view. */
volatile __u32 tl_fleet_stale;

/* The packets since its rate's reference a CPU needs to latch an onset
 * (docs/design.md §12, "The fleet's first second"; tiers.FleetLatchMin):
 * TL_SMOOTH_ONSET_MIN over the fleet's member count, rounded up, written
 * by the agent with the count (bpf.Limiter.SetFleetOwn): a flood that
 * reaches every member at once reaches each at 1/members of its rate. */
volatile __u64 tl_fleet_latch_min = TL_SMOOTH_ONSET_MIN;

/* The least packets since the reference that latch: tl_fleet_latch_min
 * (1 to TL_SMOOTH_ONSET_MIN) with the view, TL_SMOOTH_ONSET_MIN past its
 * expiry (alone, a member latches as a single host). */
static __always_inline __u64 tl_fleet_latch_least(void)
{
	__u64 m = tl_fleet_latch_min;
	if (tl_fleet_stale || m > TL_SMOOTH_ONSET_MIN)
		return TL_SMOOTH_ONSET_MIN;
	return m ? m : 1;
}

/* At a CPU's refresh (once per tick): whether the view has expired,
 * written only when that changed. */
static __always_inline void fleet_refresh(void)
{
	__u32 stale = bpf_ktime_get_ns() >= tl_fleet_expiry;
	if (stale != tl_fleet_stale)
		tl_fleet_stale = stale;
}

/* r past the view's expiry: r × tl_fleet_fb_mult on 2^16, alone, at
 * most TL_FLEET_RHAT_MAX (below the 2^48 that sm_beyond's product
 * allows). A global function: the verifier checks it once, and a packet
 * with a view pays no call. */
__noinline __u64 tl_fleet_scale(__u64 r)
{
	TL_FN(TL_FLEET_SCALE);
	__u64 k = tl_fleet_fb_mult;
	if (k > TL_FLEET_MULT_MAX)
		k = TL_FLEET_MULT_MAX;
	if (r > TL_FLEET_RHAT_MAX)
		r = TL_FLEET_RHAT_MAX;
	/* r ≤ 2^47 and k ≤ 2^32: (r >> 16) × k < 2^64 */
	__u64 x = (r >> TL_SMOOTH_FRAC_BITS) * k + (((r & (TL_SMOOTH_ONE - 1)) * k) >> TL_SMOOTH_FRAC_BITS);
	return x > TL_FLEET_RHAT_MAX ? TL_FLEET_RHAT_MAX : x;
}

/* The others' sum o a packet is judged on at own R̂ r, with the view
 * (docs/design.md §12, "The fleet's first second"; tiers.FleetOthersNow):
 * o while this CPU is not latched; latched, while own, this member's R̂ at
 * the report o answers, is below TL_SMOOTH_ONSET_MIN (it was idle), the
 * equal-share prior max(o, (members − 1) × r), members − 1 at most
 * TL_FLEET_MEMBERS_MAX; else o scaled by the rise r/own, at most
 * TL_FLEET_RISE_CAP, with inv = 2^48/own from the agent (no division per
 * packet): (r − own) × inv >> 32 is the rise less one on 16 fractional
 * bits, below 2^20, and no product passes 2^64 for o ≤ 2^46 and r < 2^48.
 * At most TL_FLEET_OTHERS_MAX. 0 members (the agent has not written
 * them, or wrote 0 in fallback) is the plain fleet: o. tot picks the
 * total's globals (tl_fleet_others, tl_fleet_own, tl_fleet_inv), else the
 * in-budget ones. A global function, so that the verifier checks its
 * branches once, not at each state of its three callers; its frame, a
 * few registers, adds to the caller's chain beside sm_refresh's larger
 * one. Past the view's expiry it is not called: the fallback judges
 * alone, unscaled. */
__noinline __u64 tl_fleet_others_now(__u64 r, __u32 tot, __u32 onset)
{
	TL_FN(TL_FLEET_OTHERS_NOW);
	__u64 o = tot ? tl_fleet_others : tl_fleet_others_in;
	__u64 m = tl_fleet_members;
	if (!onset || !m)
		return o;
	__u64 own = tot ? tl_fleet_own : tl_fleet_own_in;
	if (own < TL_SMOOTH_ONSET_MIN && m > 1) {
		m = m - 1 < TL_FLEET_MEMBERS_MAX ? m - 1 : TL_FLEET_MEMBERS_MAX;
		__u64 p = m * (r < TL_FLEET_OTHERS_MAX ? r : TL_FLEET_OTHERS_MAX);
		if (p > TL_FLEET_OTHERS_MAX)
			p = TL_FLEET_OTHERS_MAX;
		return p > o ? p : o;
	}
	if (!o || r <= own)
		return o;
	__u64 inv = tot ? tl_fleet_inv : tl_fleet_inv_in;
	__u64 x;
	if (!own || r - own >= (TL_FLEET_RISE_CAP - 1) * own)
		x = o * TL_FLEET_RISE_CAP;
	else
		x = o + sm_mul_shr(o, ((r - own) * inv) >> 32, 16);
	return x < TL_FLEET_OTHERS_MAX ? x : TL_FLEET_OTHERS_MAX;
}

/* The fleet's R̂ of this member's own estimate r, R̂_in (tot 0) or
 * R̂_tot (tot 1), on a CPU latched or not (onset): with the view, r plus
 * the others' sum of the same kind as tl_fleet_others_now scales it;
 * past its expiry, tl_fleet_scale's, the own/inv/members globals
 * ignored. */
static __always_inline __u64 tl_fleet_rhat(__u64 r, __u32 tot, __u32 onset)
{
	if (__builtin_expect(!tl_fleet_stale, 1)) {
		/* tl_fleet_others_now's first case, without the call: every
		 * packet of a CPU not latched, and every packet without a
		 * fleet (0 members). */
		if (!onset || !tl_fleet_members)
			return r + (tot ? tl_fleet_others : tl_fleet_others_in);
		return r + tl_fleet_others_now(r, tot, onset);
	}
	return tl_fleet_scale(r);
}

#endif /* __TL_FLEET_H */
