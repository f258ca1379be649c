/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Structs and enums of the shed record (docs/design.md §10; record.h) and of the
 * smooth shape (docs/design.md §9; smooth.h) that Go shares (bpf2go -type in
 * gen.go): a part of types.h, in a file of its own to keep each under 400
 * lines. */
#ifndef __TL_TYPES_RECORD_H
#define __TL_TYPES_RECORD_H

#include "include/tl_kernel.h"
#include "consts.h"

/* Why a sampled packet was shed (tl_sample.reason, docs/design.md §10). */
enum tl_reason {
	TL_REASON_TIER = 0,        /* its tier's draw (or a drop that pays protection's debt) */
	TL_REASON_OVER_BUDGET = 1, /* its source group was over budget (§6) */
	TL_REASON_SHED_FIRST = 2,  /* a shed_first severity, judged at the next tier's rate (§7) */
	TL_REASON_FRAGMENT = 3,    /* a fragment that follows a dropped first */
	TL_REASONS = 4,
};

/* One sampled shed packet, as the program writes it into shed_samples
 * (record.h): its verdict, then the first caplen bytes of its frame.
 * Format TL_SAMPLE_FORMAT (2); an older program's samples (format 1, 304
 * bytes: format and pass were padding, zero, and data began at byte 48,
 * where facility is now) are read by bpf.DecodeSample too. */
struct tl_sample {
	__u64 time_ns;  /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) */
	__u32 ifindex;  /* the interface it arrived on */
	__u32 len;      /* the frame's length */
	__u32 caplen;   /* bytes of data kept: min(len, rec_snaplen) */
	__u8 tier;      /* its tier; TL_RECORD_NONE over budget and for fragments */
	__u8 reason;    /* enum tl_reason */
	__u8 verdict;   /* TL_DROP, or TL_WOULD_DROP in dry-run */
	__u8 sev;       /* its <PRI>'s severity 0..7; TL_RECORD_NONE when not read */
	__u8 sev_class; /* enum tl_sev_class */
	__u8 family;    /* the group's family, 4 or 6; 0 when not found */
	__u8 prefix;    /* the group's prefix length */
	__u8 format;    /* TL_SAMPLE_FORMAT */
	/* The pass probability in force when it was judged, a fraction of 2^32:
	 * ~thr of the threshold it was drawn at (0: always dropped; 0xffffffff
	 * reads as 1); 0 for a debt payer and a fragment following a drop */
	__u32 pass;
	__u32 group[4]; /* the source group: the source address masked as tl_src_key */
	__u8 facility;  /* its <PRI>'s facility 0..23; TL_RECORD_NONE when not read */
	__u8 _pad[7];
	__u8 data[TL_RECORD_SNAP_MAX];
};

/* The cap's shared state (record_gate): the theoretical arrival time of
 * the next sample, on the gate's clock; alone in its cache line. */
struct tl_record_gate {
	__u64 tat;
	__u64 _pad[7];
};

/* One CPU's counts of samples (record_cpu). */
struct tl_record_cpu {
	__u64 sampled; /* samples written into the ring */
	__u64 lost;    /* samples the ring had no room for */
};

/* enum of tl_settings.shape; values match tiers.Shape. */
enum tl_shape {
	TL_SHAPE_ORDINAL = 0,
	TL_SHAPE_SMOOTH = 1,
};

/* One CPU's smooth estimate of the current window, refreshed at its first
 * packet of each tick (smooth.h; tiers.SmoothCoef). */
struct tl_smooth_cpu {
	__u64 id;       /* tl_window.opened + 1 of the window it describes; 0: none */
	__u64 tick;     /* the tick it was computed in */
	__u64 base_in;  /* the previous window's in-budget share of the last window's span */
	__u64 prev_in;  /* the previous window's in-budget count, less the gap's share */
	__u64 base_tot; /* base_in for all selected packets, over-budget ones included */
	__u64 mult;     /* 1/max(f, min), TL_SMOOTH_FRAC_BITS fractional bits */
	__u64 ovf;      /* in-budget packets counted per CPU past saturation, summed */
	__u64 ex;       /* over-budget packets of the window, summed */
	__u64 hi_r;     /* R̂ of hi_thr, the memo of q past the table; 0: none */
	__u32 hi_thr;
	__u32 ex_thr;   /* the over-budget packets' drop threshold, memo of (ex_r, ex_rin) */
	__u64 rng;      /* xorshift64* state, reseeded from bpf_get_prandom_u32 each tick */
	__u32 slot;     /* the policy slot it was computed for: a reload refreshes it */
	__u32 clock;    /* 1 in the TL_SMOOTH_CLOCK_TICKS ticks after a latch: E is read from the clock */
	/* The recent rate (smooth.h sm_recent; docs/design.md §9): measured
	 * from the reference sample (tick, in-budget count of groups within
	 * their budget, count of all selected packets); the candidate
	 * becomes the reference once it is a sixteenth of a window old;
	 * k_rate projects the count since the reference over a window
	 * (tiers.SmoothRecentMult). The counts outlive the window: at the
	 * first refresh of the next window they move down by its final
	 * counts (turn 1), or start again (turn 2). */
	__u64 ref_tick;
	__u64 ref_n;
	__u64 cand_tick;
	__u64 cand_n;
	__u64 k_rate;
	__u64 ref_a;
	__u64 cand_a;
	/* The onset's latch (sm_latch): E at the latch (0: not latched), and
	 * the origin the rate is read from on the clock after it: tick, ns,
	 * the two counts. xh is the window's exh_in at the latest refresh. */
	__u64 lat;
	__u64 o_tick;
	__u64 o_ns;
	__u64 o_a;
	__u64 o_m;
	__u64 xh;
	__u64 turn;
	/* Over-budget packets (smooth.h over_budget_thr): this CPU's own count
	 * of them when ex was summed, and the estimates ex_thr was computed
	 * for (all selected packets, in-budget ones; ex_r 0: none). */
	__u64 ex_own;
	__u64 ex_r;
	__u64 ex_rin;
	/* Budgets on: the previous window's final in-budget count, which
	 * the in-budget profile's share reads (smooth_prof.h). */
	__u64 prev_in_all;
};

/* The profiles of the in-budget count, with budgets on (smooth_prof.h;
 * tiers.SmoothProfile): for the window whose id is even in [0], odd in
 * [1], at[i][k] is its in-budget count at the first refresh (any CPU's)
 * at or after tick k × step of the window, where tag[i][k] is its
 * tl_window.opened + 1; the steps before the latest one taken are all
 * taken. */
struct tl_smooth_prof {
	__u64 tag[2][TL_SMOOTH_PROF_N];
	__u64 at[2][TL_SMOOTH_PROF_N];
};

#endif /* __TL_TYPES_RECORD_H */
