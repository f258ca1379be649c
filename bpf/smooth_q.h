/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The smooth shape's pass probability: q on the 2^32 scale with guarded
 * products, the table past its end, and the over-budget share: smooth.h's
 * arithmetic. */
#ifndef __TL_SMOOTH_Q_H
#define __TL_SMOOTH_Q_H

#include "maps.h"
#include "policy.h"

/* x × y >> TL_SMOOTH_FRAC_BITS; the callers keep x below 2^41 and y below
 * 2^22, so the product fits. */
static __always_inline __u64 sm_mul(__u64 x, __u64 y)
{
	return (x * y) >> TL_SMOOTH_FRAC_BITS;
}

/* The fractional bits of a count of passes are 16 − sm_pass_shift: 16 but
 * for tables past 2^46 packets (shift over 26), whose counts would
 * overflow 64 bits (tiers.SmoothTable.PassShift). */
static __always_inline __u32 sm_pass_shift(const struct tl_settings *s)
{
	return s->shift > 26 ? s->shift - 26 : 0;
}

/* a × b >> k, exact while (a >> k) × b and 2^k × b are below 2^64
 * (tiers.mulShr). */
static __always_inline __u64 sm_mul_shr(__u64 a, __u64 b, __u32 k)
{
	return (a >> k) * b + (((a & ((1ULL << k) - 1)) * b) >> k);
}

/* The drop threshold of pass probability p / r, p a count of passes with
 * 16 − ps fractional bits and r >= 1 packets: 2^32 − p × 2^(16+ps) / r
 * (tiers.passThreshold). Exact while p < 2^(48−ps); past that r >= 2^32,
 * and r is shifted instead. Never TL_THR_ALWAYS while p > 0 (docs/design.md §9
 * property 5): the least pass probability is 2 / 2^32. */
static __always_inline __u32 sm_pass_thr(__u64 p, __u64 r, __u32 ps)
{
	__u32 k = 16 + (ps & 15);
	__u64 ratio;
	if (!p)
		return TL_THR_ALWAYS;
	if (p < (1ULL << (64 - k)))
		ratio = (p << k) / r;
	else if (r >> k)
		ratio = p / (r >> k);
	else
		return TL_THR_NEVER;
	if (ratio >= (1ULL << 32))
		return TL_THR_NEVER;
	if (ratio < 2)
		ratio = 2;
	return (__u32)((1ULL << 32) - ratio);
}

/* P(R̂) past the table, 16 − sm_pass_shift fractional bits, R̂ >=
 * sm_last_n: the closed form pass_base + (R̂ − sm_last_n) × the last
 * tier's pass probability, taken on 32 bits from last_thr (sm_pass_last's
 * 16 bits made a last tier of drop 99.99 % pass 7 % too much), for R̂
 * below 2^(48 + sm_pass_shift) (tiers.SmoothTable.pass16). */
static __always_inline __u64 sm_pass_beyond(const struct tl_settings *s, __u64 rhat)
{
	__u64 pl = s->last_thr == TL_THR_ALWAYS ? 0 : (1ULL << 32) - s->last_thr;
	return s->sm_pass_base + sm_mul_shr(rhat - s->sm_last_n, pl, 16 + sm_pass_shift(s));
}

/* q(R̂) past the table, from the closed form, on the 2^32 scale: one
 * division (tiers.SmoothTable.Beyond). */
static __always_inline __u32 sm_beyond(const struct tl_settings *s, __u64 rhat)
{
	if (rhat < s->sm_last_n)
		rhat = s->sm_last_n;
	if (!rhat)
		rhat = 1;
	return sm_pass_thr(sm_pass_beyond(s, rhat), rhat, sm_pass_shift(s));
}

/* The tier and q(R̂) of an estimate: the smooth table's entry R̂ >> shift,
 * or the closed form past it (tiers.Table.Smooth). Past the table, q is
 * memoised per CPU and reused while R̂ stays within 1/1024 of the R̂ it was
 * computed for, so that a steady flood pays no division per packet. */
static __always_inline int sm_entry(const struct tl_settings *s, __u32 slot, struct tl_smooth_cpu *c,
				    __u64 rhat, __u32 *tier, __u32 *thr)
{
	if (rhat < s->sm_last_n)
		return table_entry(s, slot, rhat, tier, thr);
	*tier = s->last_tier;
	__u64 d = rhat > c->hi_r ? rhat - c->hi_r : c->hi_r - rhat;
	if (!c->hi_r || d > c->hi_r >> 10) {
		c->hi_r = rhat;
		c->hi_thr = sm_beyond(s, rhat);
	}
	*thr = c->hi_thr;
	return 1;
}

/* P(r) with 16 − sm_pass_shift fractional bits (tiers.Table.pass16): past
 * the table the closed form, in it r × (1 − q(r)) with q at 16 bits. */
static __always_inline __u64 sm_pass16(const struct tl_settings *s, __u32 slot, struct tl_smooth_cpu *c, __u64 r)
{
	__u32 tier, thr;
	if (r >= s->sm_last_n)
		return sm_pass_beyond(s, r);
	if (!table_entry(s, slot, r, &tier, &thr))
		return 0;
	if (thr == TL_THR_ALWAYS)
		return 0;
	return sm_mul_shr(r, TL_SMOOTH_ONE - (thr >> 16), sm_pass_shift(s));
}

/* The over-budget packets' threshold when the in-budget expectation is rin
 * and the estimate of all selected packets rtot: they pass P(rtot) −
 * P(rin) together, (P(rtot) − P(rin)) / (rtot − rin) each
 * (tiers.Table.ShareThreshold). */
static __always_inline __u32 sm_share(const struct tl_settings *s, __u32 slot, struct tl_smooth_cpu *c,
				      __u64 rin, __u64 rtot)
{
	__u32 tier, thr;
	if (rtot <= rin + 1) {
		if (rin + 1 >= s->sm_last_n)
			return sm_beyond(s, rin + 1);
		return table_entry(s, slot, rin + 1, &tier, &thr) ? thr : TL_THR_NEVER;
	}
	__u64 pin = sm_pass16(s, slot, c, rin), ptot = sm_pass16(s, slot, c, rtot);
	if (ptot <= pin)
		return TL_THR_ALWAYS;
	return sm_pass_thr(ptot - pin, rtot - rin, sm_pass_shift(s));
}

/* The over-budget threshold of (rin, rtot), memoised in c: a function of
 * its own (a BPF-to-BPF call), so that the share's lookups and division
 * take no room in the callers' stack frame. */
static __noinline void sm_share_memo(struct tl_smooth_cpu *c, const struct tl_settings *s, __u32 slot, __u64 rin,
				     __u64 rtot)
{
	TL_FN(SM_SHARE_MEMO);
	c->ex_r = rtot ? rtot : 1;
	c->ex_rin = rin;
	c->ex_thr = sm_share(s, slot & (TL_SLOTS - 1), c, rin, rtot);
}

#endif /* __TL_SMOOTH_Q_H */
