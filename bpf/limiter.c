//go:build ignore
/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* tierlimit: an XDP tiered load shedder for log collectors.
 *
 * Selected packets (an L4 protocol and destination port, optionally narrowed
 * to destination prefixes) are counted in one window shared by all CPUs. The
 * count n of a packet indexes a tier table compiled by the agent; the table
 * entry holds the tier and its drop threshold on the bpf_get_prandom_u32()
 * scale. Everything else passes untouched. docs/design.md §2 has the semantics.
 *
 * This file holds the entry point, tl_parse and the judgement (tl_judge_tail,
 * tail-called, and tl_judge, its fallback); the rooms they
 * call are headers, in the order a packet meets them: parse.h (UDP and
 * TCP, pkt_pack, the common frame's parse_udp_fast) over parse_ip.h (Ethernet, VLAN, IPv4, IPv6), cursor.h
 * (the parsers' cursor) and ipv6_opts.h (hop-by-hop and destination
 * options); fragments.h (fragments that follow a judged first); policy.h
 * (active slot, selectors, exempt sources, tier table); host.h (frames
 * the kernel discards: another host's MAC, martians); segments.h (UDP
 * super-packets); sources.h (per-source budgets); window.h (the shared
 * window) with overflow.h (a saturated window's per-CPU slots); smooth.h
 * (the smooth shape) with smooth_q.h (its pass probability), smooth_rate.h
 * (the recent rate and its latch), smooth_prof.h (its in-budget profile) and fleet.h (the
 * fleet's view and the fallback it applies alone); severity.h
 * (<PRI> and severity rules); verdict.h (mode and draw, counters, a
 * first fragment's verdict for the rest, TL_STAGE); record.h (samples of
 * shed packets). maps.h holds every map; consts.h the limits; types.h,
 * types_record.h and types_sources.h the structs and enums Go shares;
 * calls.h the calls a packet pays, counted in a test build
 * (TL_COUNT_CALLS). */

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"
#include "consts.h"
#include "types.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "record.h"
#include "verdict.h"
#include "fragments.h"
#include "window.h"
#include "smooth.h"
#include "sources.h"
#include "severity.h"
#include "segments.h"
#include "host.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Never read: puts the shared enums in BTF for bpf2go (types.h). */
const struct tl_contract *tl_contract_btf __attribute__((unused));

/* p's <PRI> (0..191: facility and severity) when s reads severities
 * (docs/design.md §7): TL_SEV_NONE for a packet whose <PRI> is not read
 * (not UDP, or unclassified), -1 for one with no <PRI>. The payload is at pri_off from
 * data, bounded so that the verifier can range-check a pointer at it
 * (TL_PRI_OFF_MAX: a payload further in is read as having no <PRI>). */
static __always_inline int judge_sev(struct xdp_md *ctx, const struct tl_settings *s, const struct pkt *p,
				     void *data, void *data_end, __u32 pri_off)
{
	struct cursor c = { .pos = data + (pri_off & TL_PRI_OFF_MAX), .end = data_end };

	if (!s->sev_on || p->l4proto != IPPROTO_UDP || p->uncl)
		return TL_SEV_NONE;
	return pri_off <= TL_PRI_OFF_MAX ? parse_pri(&c, udp_payload(ctx, p, data, data_end, pri_off)) : -1;
}

/* Whether p is selected by the policy (policy.h). A frame Linux discards
 * (another host's MAC, a martian: host.h) is not selected either: judge
 * asks tl_host_discards first. */
static __always_inline int judge_selected(const struct pkt *p, __u32 slot, const struct tl_settings *s)
{
	return p->uncl ? uncl_selected(p, slot, s) : is_selected(p, slot, s);
}

/* Whether p comes from an exempt source (policy.h is_exempt): then it is
 * counted as exempt, its fragments will pass, and it passes. */
static __always_inline int judge_exempt(const struct pkt *p, __u32 slot, const struct tl_settings *s, __u64 bytes)
{
	if (!(s->flags & TL_HAS_EXEMPT) || !is_exempt(p, slot))
		return 0;
	count(&misc_stats, TL_MISC_EXEMPT, 1, bytes);
	if (p->frag == FRAG_FIRST)
		remember_first(p, TL_PASS);
	return 1;
}

/* The verdict of a packet at window position pos: its tier (into *tier)
 * and threshold (into *thr: the one it was drawn at, severity.h) from the
 * tier table, or from the smooth shape (smooth.h), then its <PRI>'s rule
 * (severity.h) or the draw (verdict.h). Returns -1 when there is no tier
 * to read: the packet goes unselected. */
static __always_inline int judge_tier(struct tl_window *w, const struct tl_settings *s, __u32 slot,
				      struct window_pos *pos, int pri, __u64 bytes, __u32 segs, __u32 wt, __u32 *tier,
				      __u32 *thr)
{
	struct tl_smooth_cpu *sc = NULL;

	if (s->shape == TL_SHAPE_SMOOTH) {
		sc = sm_judge(w, s, slot, pos, tier, thr);
		if (!sc)
			return -1;
	} else if (!tier_entry(s, slot, pos->n, tier, thr)) {
		return -1;
	}
	if (pri != TL_SEV_NONE)
		return tl_severity_judge(s, w, pri, *tier, thr, bytes, segs, wt);
	if (s->mode != TL_MODE_OFF && (sc ? sm_drop(sc, *thr) : draw_drop(*thr)))
		return mode_verdict(s);
	return TL_PASS;
}

/* Counts a judged packet's segs datagrams under its tier and verdict,
 * samples it when shed (record.h; thr the threshold it was drawn at),
 * remembers a first fragment's verdict for the rest (verdict.h), and
 * returns its XDP action. */
static __always_inline int judge_close(struct xdp_md *ctx, void *data, const struct pkt *p,
				       const struct tl_settings *s, __u32 slot, __u32 tier, __u32 thr, __u32 verdict,
				       int pri, __u32 segs, __u64 bytes)
{
	count(&stats, tier * TL_VERDICTS + verdict, segs, bytes);
	count(&bytes_stats, verdict, segs, p->plen);
	if (verdict != TL_PASS && s->rec_samples && record_token(s))
		tl_record(ctx, record_meta(p, data, slot, tier, TL_REASON_TIER, verdict, pri), thr);
	if (p->frag == FRAG_FIRST)
		remember_first(p, verdict);
	return xdp_action(verdict);
}

/* The judgement of a parsed UDP or TCP packet, from its header fields
 * (pkt_pack): settings, selectors, exempt sources, source budget, window,
 * tier table and severity; counts it and returns the XDP action.
 *
 * Verified with its arguments unknown (the body of tl_judge_tail, where
 * they come from a map, and of the global function tl_judge), once,
 * instead of once for every path through the parser that reaches it: VLAN
 * depths, IPv4 options, IPv6 extension-header chains and fragment kinds
 * each leave different packet offsets, and every one of them would
 * otherwise be explored through the selectors' loop and everything after
 * (TestVerifierComplexity). The headers are found again from ctx, by
 * offset, and bounds checked. */
static __always_inline int judge(struct xdp_md *ctx, struct tl_judge_args *ja)
{
	/* For this host first: one Linux discards is not selected. The entry
	 * point answered the common case (host.h host_keeps); a1's
	 * TL_A1_HOST_CHECK asks tl_host_discards' call for the rest, a
	 * frame the policy may not select either (its verdict is the same:
	 * unselected). The call comes before anything is derived from the
	 * arguments, which are read again after it from ja, this CPU's
	 * tl_judge_args: Linux 6.1's verifier cannot follow a scalar's
	 * precision back across a call of a subprogram and then marks every
	 * scalar of every earlier state precise, which stops them pruning
	 * (kernel/bpf/verifier.c backtrack_insn, -ENOTSUPP at
	 * BPF_PSEUDO_CALL; followed since Linux 6.4). After the call, an
	 * offset added to a pointer (the headers', the severity's, the
	 * sketch's cells) traces back to a load from ja, and stops there:
	 * tierlimit 709,783 instructions on 6.1 against 840,019 with the call
	 * inside the judgement (deploy/bench/hotpath.md). The bit apart from
	 * a1, in a register of its own: a branch on a1 itself would split the
	 * verifier's states on a1 through the rest of tl_judge (+14k
	 * instructions on 6.18). */
	__u64 check = READ_ONCE(ja->a1) & TL_A1_HOST_CHECK;
	asm volatile("" : "+r"(check));
	int discards = check && tl_host_discards(ctx, READ_ONCE(ja->a1));
	__u64 a1 = READ_ONCE(ja->a1), a2 = READ_ONCE(ja->a2);
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 bytes = data_end - data;
	struct pkt p = {};
	__u32 pri_off = pkt_unpack(&p, a1, a2, data, data_end);
	TL_STAGE(TL_STAGE_JUDGE, XDP_DROP);

	__u32 zero = 0, slot;
	struct tl_settings *s = active_settings(&zero, &slot);
	if (!s || !s->table_len)
		goto unselected;
	/* Read the <PRI> now, so that the cursor is dead from here on: the
	 * verifier then need not tell apart the parser's paths below. */
	int pri = judge_sev(ctx, s, &p, data, data_end, pri_off);
	int sel = discards ? 0 : judge_selected(&p, slot, s);
	if (!sel)
		goto unselected;
	/* A frame with more VLAN tags than we walk has no header we know:
	 * no source to exempt or to group. */
	int has_l3 = p.uncl != 1 + TL_UNCL_VLAN_DEPTH;
	if (has_l3 && judge_exempt(&p, slot, s, bytes))
		return XDP_PASS;
	TL_STAGE(TL_STAGE_POLICY, XDP_DROP);

	struct tl_window *w = bpf_map_lookup_elem(&window, &zero);
	if (!w)
		goto unselected;
	if (p.uncl)
		count(&unclassified_stats, (__u32)(p.uncl - 1), 1, bytes);
	/* A super-packet counts as the datagrams it carries (segments.h), in
	 * every place a datagram is charged: its group's budget, the window
	 * (the rest of its datagrams join right behind the first, and the
	 * whole skb takes the verdict of its last datagram's n), the debt and
	 * the counters. */
	__u32 segs = 1;
	if (tl_skb_ifaces && !p.uncl)
		segs = super_segments(ctx, p.l4proto == IPPROTO_TCP, pri_off, 1);
	/* The weight (docs/design.md §2): under count: bytes the L4 payload,
	 * a super-packet's being every segment's, as the kernel splits it:
	 * the frame past the first L4 header (so too an unclassified frame's
	 * past the headers walked, and one of TL_PLEN_FRAME). */
	if (segs > 1 || p.uncl || p.plen == TL_PLEN_FRAME)
		p.plen = bytes > pri_off ? bytes - pri_off : 0;
	/* A SYN or an empty datagram weighs 0: judged at the bytes before
	 * it (past saturation in the last tier, window.h window_count). */
	p.wt = s->flags & TL_COUNT_BYTES ? p.plen : segs;
	if (s->src_budget && has_l3 && sel != TL_SEL_COUNTED) {
		int act = source_budget(ctx, &p, s, slot, w, bytes, pri, segs);
		if (act >= 0)
			return act;
	}
	struct window_pos pos;
	window_count(w, s, &pos, p.wt);
	TL_STAGE(TL_STAGE_WINDOW, XDP_DROP);
	/* A segment of a syn rule's connection under count: bytes: counted,
	 * never shed (docs/design.md §2). */
	if (sel == TL_SEL_COUNTED) {
		count(&bytes_stats, TL_BYTES_TCP_COUNTED, segs, p.plen);
		return XDP_PASS;
	}

	/* thr set before judge_tier: Linux 6.1's verifier walks paths where
	 * no threshold was read (it cannot tell them infeasible), and with
	 * thr undefined clang may leave a pointer in its register there,
	 * whose 4-byte spill 6.1 refuses ("invalid size of register spill"). */
	__u32 tier, thr = 0;
	int verdict = judge_tier(w, s, slot, &pos, pri, bytes, segs, p.wt, &tier, &thr);
	if (verdict < 0)
		goto unselected;
	return judge_close(ctx, data, &p, s, slot, tier, thr, verdict, pri, segs, bytes);

unselected:
	return pass_unselected(&p, bytes);
}

/* The judgement as a BPF-to-BPF call: what the entry point runs when the
 * tail call to tl_judge_tail fails (tl_jump empty, judge_packed). A global
 * function, verified once (judge). It hands judge its arguments in this
 * CPU's tl_judge_args, as the tail call does (judge says why). */
__noinline int tl_judge(struct xdp_md *ctx, __u64 a1, __u64 a2)
{
	TL_FN(TL_JUDGE);
	__u32 zero = 0;
	struct tl_judge_args *ja = bpf_map_lookup_elem(&tl_judge_args, &zero);
	if (!ja)
		return XDP_PASS;
	ja->a1 = a1;
	ja->a2 = a2;
	return judge(ctx, ja);
}

/* The judgement as a program of its own, the one slot of tl_jump: the
 * entry point tail-calls it (judge_packed) with the packet's header fields
 * in this CPU's tl_judge_args. A tail call is a jump (the x86-64 JIT
 * patches a constant slot into a direct jmp): the packet pays no call and
 * no return for its judgement, where a BPF-to-BPF call's return pays the
 * return thunk of CPUs with SRSO's "Safe RET" (issue 42: 8.7 ns a call on
 * AMD EPYC). Never attached: run alone, it reads the arguments the entry
 * point last wrote on this CPU (bounds checked all the same). */
SEC("xdp")
int tl_judge_tail(struct xdp_md *ctx)
{
	TL_FN(TL_JUDGE_TAIL);
	__u32 zero = 0;
	struct tl_judge_args *ja = bpf_map_lookup_elem(&tl_judge_args, &zero);
	if (!ja)
		return XDP_PASS;
	return judge(ctx, ja);
}

/* Judges the packet packed in a1 and a2: a tail call to tl_judge_tail, or
 * the same judgement by the call of tl_judge when the kernel allows no
 * tail call here (tl_judge_jump 0) or tl_jump holds no program (its pin
 * removed and its last holder closed: the kernel empties a program array
 * then, kernel/bpf/arraymap.c prog_array_map_clear). */
static __always_inline int judge_packed(struct xdp_md *ctx, __u64 a1, __u64 a2)
{
	__u32 zero = 0;
	struct tl_judge_args *ja = tl_judge_jump ? bpf_map_lookup_elem(&tl_judge_args, &zero) : NULL;
	if (ja) {
		ja->a1 = a1;
		ja->a2 = a2;
		bpf_tail_call_static(ctx, &tl_jump, 0);
	}
	return tl_judge(ctx, a1, a2);
}

/* tl_parse's result for a packet to judge: not an XDP action. */
#define TL_JUDGE (-1)

/* Parses the frame (parse.h) and settles every packet that needs no
 * judgement: returns its XDP action, or TL_JUDGE with the packet packed in
 * args (pkt_pack). A function of its own (a BPF-to-BPF call), so that the
 * parser's state (the cursor, struct pkt) is off the stack by the time
 * tl_judge and the global functions it calls run: the verifier bounds the
 * stack of a chain of calls at 512 bytes. */
static __noinline int tl_parse(struct xdp_md *ctx, __u64 *args)
{
	TL_FN(TL_PARSE);
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 bytes = data_end - data;
	struct pcur c = { .ctx = ctx, .data = data, .end = data_end, .len = bytes };
	struct pkt p = {};
	int deep = 0;

	switch (parse_packet(&c, &p)) {
	case PKT_L4:
		TL_STAGE(TL_STAGE_PARSED, XDP_DROP);
		break;
	case PKT_DEEP:
		deep = 1;
		break;
	case PKT_FOLLOW:
		return follow_fragment(ctx, &p, bytes);
	case PKT_TINY:
		return tiny_fragment(&p, bytes);
	case PKT_MALFORMED:
		count(&malformed_stats, p.mal < TL_MAL_MAX ? p.mal : TL_MAL_IPV4_LENGTH, 1, bytes);
		return XDP_PASS;
	default:
		return pass_unselected(&p, bytes);
	}
	/* Only scalars cross into tl_judge: offsets and header fields. */
	pkt_pack(&p, deep, c.off, &args[0], &args[1]);
	return TL_JUDGE;
}

SEC("xdp")
int tierlimit(struct xdp_md *ctx)
{
	__u64 args[2] = {};

	TL_FN(PACKETS);
	TL_STAGE(TL_STAGE_ENTRY, XDP_DROP);
	/* Whether the frame needs tl_host_discards' test: the interfaces are
	 * described and the common case (host.h host_keeps) does not keep it.
	 * Here, before the parse: in tl_judge, checked once with the frame
	 * unknown, the inline test split every state after it (+163k
	 * instructions verified on 6.18); in tl_parse, or after it, the
	 * verifier walks it on each of the parser's paths (+27k, +32k). */
	__u64 check = tl_if_count && !host_keeps(ctx) ? TL_A1_HOST_CHECK : 0;
	/* The common frame, parsed here (parse.h parse_udp_fast): no call of
	 * tl_parse. Any other goes to tl_parse. */
	__u64 a1, a2;
	if (parse_udp_fast(ctx, &a1, &a2)) {
		TL_STAGE(TL_STAGE_PARSED, XDP_DROP);
		return judge_packed(ctx, a1 | check, a2);
	}
	int act = tl_parse(ctx, args);
	if (act != TL_JUDGE)
		return act;
	return judge_packed(ctx, args[0] | check, args[1]);
}
