//go:build ignore
/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* tierlimit: an XDP tiered load shedder for log collectors.
 *
 * Selected packets (an L4 protocol and destination port, optionally narrowed
 * to destination prefixes) are counted in one window shared by all CPUs. The
 * count n of a packet indexes a tier table compiled by the agent; the table
 * entry holds the tier and its drop threshold on the bpf_get_prandom_u32()
 * scale. Everything else passes untouched. DESIGN.md §2 has the semantics.
 *
 * This file holds the entry point and tl_judge; the rooms they call are
 * headers, in the order a packet meets them: parse.h (Ethernet to UDP or
 * TCP, pkt_pack), policy.h (active slot, selectors, exempt sources, tier
 * table), sources.h (per-source budgets), window.h (the shared window),
 * severity.h, segments.h (UDP super-packets), verdict.h (mode and draw,
 * counters, fragments, TL_STAGE). maps.h holds every map; consts.h and
 * types.h the limits and the structs Go shares. */

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"
#include "consts.h"
#include "types.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "verdict.h"
#include "window.h"
#include "smooth.h"
#include "sources.h"
#include "severity.h"
#include "segments.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Never read: puts the shared enums in BTF for bpf2go (types.h). */
const struct tl_contract *tl_contract_btf __attribute__((unused));

/* The judgement of a parsed UDP or TCP packet, from its header fields
 * (pkt_pack): settings, selectors, exempt sources, source budget, window,
 * tier table and severity; counts it and returns the XDP action.
 *
 * A global function, so the verifier checks it once, with its arguments
 * unknown, instead of once for every path through the parser that reaches
 * it: VLAN depths, IPv4 options, IPv6 extension-header chains and fragment
 * kinds each leave different packet offsets, and every one of them would
 * otherwise be explored through the selectors' loop and everything after
 * (TestVerifierComplexity). The headers are found again from ctx, by
 * offset, and bounds checked. */
__noinline int tl_judge(struct xdp_md *ctx, __u64 a1, __u64 a2)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 bytes = data_end - data;
	struct pkt p = {};
	/* The payload's offset, bounded so that the verifier can range-check
	 * a pointer at it (TL_PRI_OFF_MAX: a payload further in is read as
	 * having no <PRI>). */
	__u32 pri_off = pkt_unpack(&p, a1, a2, data, data_end);
	struct cursor c = { .pos = data + (pri_off & TL_PRI_OFF_MAX), .end = data_end };
	TL_STAGE(TL_STAGE_JUDGE, XDP_DROP);

	__u32 slot;
	struct tl_settings *s = active_settings(&slot);
	if (!s || !s->table_len)
		goto unselected;
	/* Read the <PRI> now, so that the cursor is dead from here on: the
	 * verifier then need not tell apart the parser's paths below. */
	int sev = TL_SEV_NONE;
	if (s->sev_on && p.l4proto == IPPROTO_UDP)
		sev = pri_off <= TL_PRI_OFF_MAX ? parse_pri(&c, udp_payload(data, data_end, pri_off)) : -1;
	if (!is_selected(&p, slot, s))
		goto unselected;
	if ((s->flags & TL_HAS_EXEMPT) && is_exempt(&p, slot)) {
		count(&misc_stats, TL_MISC_EXEMPT, 1, bytes);
		if (p.frag == FRAG_FIRST)
			remember_first(&p, TL_PASS);
		return XDP_PASS;
	}
	TL_STAGE(TL_STAGE_POLICY, XDP_DROP);

	__u32 zero = 0;
	struct tl_window *w = bpf_map_lookup_elem(&window, &zero);
	if (!w)
		goto unselected;
	/* A super-packet counts as the datagrams it carries (segments.h), in
	 * every place a datagram is charged: its group's budget, the window
	 * (the rest of its datagrams join right behind the first, and the
	 * whole skb takes the verdict of its last datagram's n), the debt and
	 * the counters. */
	__u32 segs = 1;
	if (tl_skb_ifaces && p.l4proto == IPPROTO_UDP)
		segs = udp_segments(ctx);
	if (s->src_budget) {
		int act = source_budget(&p, s, slot, w, bytes, segs);
		if (act >= 0)
			return act;
	}
	struct window_pos pos;
	window_count(w, s, &pos, segs);
	__u64 n = pos.n;
	TL_STAGE(TL_STAGE_WINDOW, XDP_DROP);

	__u32 tier, thr;
	struct tl_smooth_cpu *sc = NULL;
	if (s->shape == TL_SHAPE_SMOOTH) {
		sc = sm_judge(w, s, slot, &pos, &tier, &thr);
		if (!sc)
			goto unselected;
	} else if (!tier_entry(s, slot, n, &tier, &thr)) {
		goto unselected;
	}
	__u32 verdict = TL_PASS;
	if (sev != TL_SEV_NONE)
		verdict = tl_severity_judge(s, w, sev, tier, thr, bytes, segs);
	else if (s->mode != TL_MODE_OFF && (sc ? sm_drop(sc, thr) : draw_drop(thr)))
		verdict = mode_verdict(s);
	count(&stats, tier * TL_VERDICTS + verdict, segs, bytes);
	if (p.frag == FRAG_FIRST)
		remember_first(&p, verdict);
	return xdp_action(verdict);

unselected:
	return pass_unselected(&p, bytes);
}

SEC("xdp")
int tierlimit(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 bytes = data_end - data;
	struct cursor c = { .pos = data, .end = data_end };
	struct pkt p = {};

	TL_STAGE(TL_STAGE_ENTRY, XDP_DROP);
	switch (parse_packet(&c, &p)) {
	case PKT_L4:
		TL_STAGE(TL_STAGE_PARSED, XDP_DROP);
		break;
	case PKT_FOLLOW:
		return follow_fragment(&p, bytes);
	case PKT_TINY:
		return tiny_fragment(&p, bytes);
	case PKT_MALFORMED:
		count(&malformed_stats, p.mal < TL_MAL_MAX ? p.mal : TL_MAL_IPV4_LENGTH, 1, bytes);
		return XDP_PASS;
	default:
		return pass_unselected(&p, bytes);
	}
	/* Only scalars cross into tl_judge: offsets and header fields. */
	__u64 a1, a2;
	pkt_pack(&p, (void *)p.l3 - data, c.pos - data, &a1, &a2);
	return tl_judge(ctx, a1, a2);
}
