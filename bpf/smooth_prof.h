/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The profile of a window's in-budget count, with budgets on (docs/design.md
 * §6; tiers.SmoothProfile): the sliding count S of the next window takes
 * the previous window's packets that came after its span's start from the
 * profile, not from an even spread, since budgets front-load a window's
 * in-budget packets (a group over its budget sends its budget first and
 * nothing after). smooth.h's refresh (sm_coef) calls it. */
#ifndef __TL_SMOOTH_PROF_H
#define __TL_SMOOTH_PROF_H

#include "maps.h"
#include "smooth_q.h"

/* The ticks between two samples of a window of j ticks: ⌈j/N⌉, at least 1
 * (tiers.SmoothProfStep). */
static __always_inline __u64 sm_prof_step(__u64 j)
{
	__u64 d = (j + TL_SMOOTH_PROF_N - 1) / TL_SMOOTH_PROF_N;
	return d ? d : 1;
}

/* Takes the in-budget count n of window id at a refresh in its step k, and
 * n for every step before it that no refresh took, down to the first one
 * taken (those before it are): a step without a refresh had no packet,
 * since every CPU refreshes at its first packet of a tick
 * (tiers.SmoothProfile.Record). The loop runs past one step only at the
 * first refresh after a step without packets. The count goes before its
 * tag, by an exchange (fully ordered), as overflow_add publishes a slot:
 * once per step and window. */
static __always_inline void sm_prof_record(struct tl_smooth_prof *p, __u64 id, __u64 k, __u64 n)
{
	__u32 b = id & 1;
	for (int i = 0; i < TL_SMOOTH_PROF_N; i++) {
		if (i > k)
			return;
		__u64 s = k - i;
		barrier_var(s);
		s &= TL_SMOOTH_PROF_N - 1;
		if (READ_ONCE(p->tag[b][s]) == id + 1)
			return;
		p->at[b][s] = n;
		__sync_lock_test_and_set(&p->tag[b][s], id + 1);
	}
}

/* Sample i of the previous window (parity b, tag id: window id − 1), of d
 * ticks each in a window of j: prev past the window's end or past the
 * samples taken, and never more than prev. */
static __always_inline __u64 sm_prof_at(const struct tl_smooth_prof *p, __u32 b, __u64 id, __u64 i, __u64 d,
					__u64 j, __u64 prev)
{
	if (i >= TL_SMOOTH_PROF_N || i * d >= j)
		return prev;
	/* The mask the compiler would drop (i < N already) bounds i for the
	 * verifier, which tracks a copy of i made before the test. */
	barrier_var(i);
	i &= TL_SMOOTH_PROF_N - 1;
	if (READ_ONCE(p->tag[b][i]) != id)
		return prev;
	__u64 v = p->at[b][i];
	return v < prev ? v : prev;
}

/* The previous window's share of S for window id at e elapsed ticks of j,
 * gap ticks after the previous window's end (both at most j): its final
 * in-budget count prev less its count at the span's start, e + ½ + gap
 * ticks into it, interpolated between the samples around it
 * (tiers.SmoothProfile.Base). */
static __always_inline __u64 sm_prof_base(const struct tl_smooth_prof *p, __u64 id, __u64 prev, __u64 e, __u64 j,
					  __u64 gap)
{
	__u32 b = (id - 1) & 1;
	__u64 d = sm_prof_step(j);
	__u64 y = 2 * e + 1 + 2 * gap; /* half-ticks into the previous window */
	if (y >= 2 * j)
		return 0;
	__u64 k = y / (2 * d);
	__u64 b0 = sm_prof_at(p, b, id, k, d, j, prev);
	__u64 b1 = sm_prof_at(p, b, id, k + 1, d, j, prev);
	if (b1 < b0)
		b1 = b0;
	__u64 hi = (k + 1) * d;
	if (hi > j)
		hi = j;
	__u64 frac = ((y - 2 * k * d) << TL_SMOOTH_FRAC_BITS) / (2 * (hi - k * d));
	return prev - b0 - sm_mul(b1 - b0, frac);
}

/* The sliding count's profile at a refresh of window id (sm_prof_refresh, with
 * budgets on), e elapsed ticks of a window of j: takes this window's
 * sample of its in-budget count n (sm_prof_record), and returns the
 * previous window's share of S (sm_prof_base) for a span that starts
 * e + ½ + gap ticks into it, where prev is its final count (eg = e | gap
 * << 32, both at most j), or TL_PROF_NONE when it has no profile (the
 * first window, or one this program did not profile), where S takes the
 * even spread. Two global functions: the verifier checks each once, not
 * at each state of each caller that refreshes, and each keeps the few
 * values it needs in registers, so that their frames stay small in the
 * call chain's 512 bytes of stack. */
#define TL_PROF_NONE (~0ULL)
__noinline int sm_prof_take(__u64 id, __u64 n, __u64 e, __u64 j)
{
	TL_FN(SM_PROF_TAKE);
	__u32 zero = 0;
	if (!j || e >= j)
		return 0;
	__u64 k = e / sm_prof_step(j);
	struct tl_smooth_prof *p = bpf_map_lookup_elem(&smooth_prof, &zero);
	if (!p)
		return 0;
	sm_prof_record(p, id, k, n);
	return 0;
}

__noinline __u64 sm_prof_share(__u64 id, __u64 prev, __u64 j, __u64 eg)
{
	TL_FN(SM_PROF_SHARE);
	__u32 zero = 0;
	struct tl_smooth_prof *p = bpf_map_lookup_elem(&smooth_prof, &zero);
	if (!p || !id || !j || READ_ONCE(p->tag[(id - 1) & 1][0]) != id)
		return TL_PROF_NONE;
	__u64 e = eg & 0xffffffff, gap = eg >> 32;
	return sm_prof_base(p, id, prev, e > j ? j : e, j, gap > j ? j : gap);
}

/* The profile's part of a refresh of window id at tick (sm_coef, with
 * budgets on, after sm_refresh): samples the window's in-budget count
 * in + the CPUs' overflow, and sets the previous window's share of S.
 * Called here, not from sm_refresh, so that the global functions' frames
 * add to the caller's chain of stack frames and not to sm_refresh's:
 * Linux 6.1 counts them in it, and main, tl_judge and sm_refresh fill its
 * 512 bytes. */
static __always_inline void sm_prof_refresh(struct tl_smooth_cpu *c, struct tl_window *w, const struct tl_settings *s,
					    __u64 id, __u64 tick, __u64 in, __u64 start)
{
	__u64 j = s->sm_ticks ? s->sm_ticks : 1;
	__u64 e = tick > start ? tick - start : 0;
	if (e > j)
		e = j;
	__u64 gap = READ_ONCE(w->gap);
	if (gap > j)
		gap = j;
	sm_prof_take(id, in + c->ovf, e, j);
	__u64 pb = sm_prof_share(id, c->prev_in_all, j, e | gap << 32);
	if (pb != TL_PROF_NONE)
		c->base_in = pb;
}

#endif /* __TL_SMOOTH_PROF_H */
