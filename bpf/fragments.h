/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The verdicts of fragments that never reach the window (docs/design.md §2): a
 * non-first fragment follows its first fragment's verdict, remembered in
 * frag_verdicts (verdict.h), and an RFC 1858 tiny fragment is shed in
 * enforce mode. */
#ifndef __TL_FRAGMENTS_H
#define __TL_FRAGMENTS_H

#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "record.h"
#include "verdict.h"

/* A non-first fragment carries no L4 header: it is never counted, and takes
 * the verdict of its first fragment when that was dropped less than
 * TL_FRAG_TTL_MS ago (docs/design.md §2). A drop is sampled (record.h). */
static __always_inline int follow_fragment(struct xdp_md *ctx, struct pkt *p, __u64 bytes)
{
	struct tl_frag_key k = {};
	frag_key(p, &k);
	struct tl_frag_verdict *v = bpf_map_lookup_elem(&frag_verdicts, &k);
	if (v && (__s64)(v->expires_ns - bpf_ktime_get_ns()) > 0) {
		count(&misc_stats, TL_MISC_FRAG_DROP, 1, bytes);
		__u32 zero = 0, slot;
		struct tl_settings *s = active_settings(&zero, &slot);
		if (s && s->rec_samples && record_token(s))
			tl_record(ctx, record_meta(p, (void *)(long)ctx->data, slot, TL_RECORD_NONE,
						   TL_REASON_FRAGMENT, TL_DROP, -1), TL_THR_ALWAYS);
		return XDP_DROP;
	}
	count(&misc_stats, TL_MISC_FRAG_PASS, 1, bytes);
	return XDP_PASS;
}

/* An RFC 1858 tiny fragment: dropped in enforce mode whatever its port (no
 * stack sends one; it hides the header the limiter judges), passed in
 * dry-run and off. Counted as malformed, never in the window. A first
 * fragment's verdict holds for its followers. */
static __always_inline int tiny_fragment(struct pkt *p, __u64 bytes)
{
	__u32 zero = 0, slot;
	struct tl_settings *s = active_settings(&zero, &slot);
	count(&malformed_stats, TL_MAL_TINY_FRAGMENT, 1, bytes);
	/* would_drop here passes like a pass, and is not remembered. */
	__u32 verdict = s && s->table_len ? mode_verdict(s) : TL_PASS;
	if (p->frag == FRAG_FIRST)
		remember_first(p, verdict);
	return xdp_action(verdict);
}

#endif /* __TL_FRAGMENTS_H */
