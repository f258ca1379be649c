/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Severity-aware shedding (docs/design.md §7): the syslog <PRI> of a UDP
 * payload, its class, and the drop debt that lets protected datagrams
 * through at the cost of others within one window. */
#ifndef __TL_SEVERITY_H
#define __TL_SEVERITY_H

#include "maps.h"
#include "parse.h"
#include "verdict.h"

/* parse_pri's result for a packet that severity does not judge. */
#define TL_SEV_NONE (-2)

/* The syslog <PRI> at the start of a UDP payload (RFC 5424 §6.2.1, RFC 3164
 * §4.1.1): "<", 1 to 3 digits without a leading zero, a value 0..191, ">".
 * len is the payload's length as the UDP header declares it (udp_payload):
 * bytes past it are Ethernet padding, not the datagram's. Returns the
 * severity (PRI mod 8), or -1 when it is missing, malformed or out of
 * range, or the payload ends first. Reads at most 5 bytes. */
static __always_inline int parse_pri(const struct cursor *c, __u32 len)
{
	const __u8 *b = c->pos;
	__u32 v = 0;

	if ((void *)(b + 3) > c->end || len < 3 || b[0] != '<')
		return -1;
#pragma unroll
	for (int i = 1; i <= 4; i++) {
		if ((void *)(b + i + 1) > c->end || (__u32)i + 1 > len)
			return -1;
		__u8 ch = b[i];
		if (ch == '>')
			return (i == 1 || v > 191) ? -1 : (int)(v & 7);
		if (i == 4 || ch < '0' || ch > '9' || (i == 2 && b[1] == '0'))
			return -1;
		v = v * 10 + (ch - '0');
	}
	return -1;
}

/* The bytes of the IPv6 payload whose header is at l3 from data, from
 * offset off of data on (udp_payload's rare path): the payload length
 * counts from the end of the fixed header; a jumbogram's (0) is the rest
 * of the frame. At most 0xffff: past a <PRI>'s 5 bytes, only whether the
 * payload holds them matters. A global function, so that the verifier
 * checks it once, not on every path to judge_sev. */
__noinline __u32 tl_udp_rest6(struct xdp_md *ctx, __u32 l3, __u32 off)
{
	if (!ctx)
		return 0;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	const struct ipv6hdr *ip6 = data + (l3 & 0xff);
	if ((void *)(ip6 + 1) > data_end)
		return 0;
	__u64 end = (l3 & 0xff) + sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
	if (!ip6->payload_len)
		end = data_end - data;
	/* The UDP length that would say as much: the header and the rest. */
	__u64 rest = end > off ? end - off + sizeof(struct udphdr) : 0;
	return rest > 0xffff ? 0xffff : rest;
}

/* The UDP payload's length as its header declares it, for the payload at
 * offset off from data (the UDP header is the 8 bytes before it) of p; 0
 * when the header cannot be read. In a first fragment it is the whole
 * datagram's, and the frame's end bounds the read. An IPv6 UDP length of
 * 0 is the rest of the IPv6 payload, as __udp6_lib_rcv reads it (and
 * parse_udp): from the payload length, or, in a jumbogram (payload length
 * 0), the rest of the frame, which then holds far more than a <PRI>
 * (docs/design.md §7). A branch on the rare path only. */
static __always_inline __u32 udp_payload(struct xdp_md *ctx, const struct pkt *p, void *data, void *data_end,
					 __u32 off)
{
	if (off < sizeof(struct udphdr))
		return 0;
	const struct udphdr *uh = data + ((off - sizeof(struct udphdr)) & TL_PRI_OFF_MAX);
	if ((void *)(uh + 1) > data_end)
		return 0;
	__u32 ulen = bounded16(bpf_ntohs(uh->len));
	if (!ulen && p->l3proto == ETH_P_IPV6)
		ulen = bounded16(tl_udp_rest6(ctx, p->l3 - data, off));
	return ulen > sizeof(*uh) ? ulen - sizeof(*uh) : 0;
}

/* Compare-and-swap attempts of one packet on the drop debt; a packet whose
 * attempts all lose to other CPUs keeps its tier verdict. */
#define TL_DEBT_TRIES 4

/* Severity-aware shedding (docs/design.md §7) of a UDP packet of class cls,
 * segs datagrams and weight wt (segs, or its bytes under count: bytes)
 * whose tier says drop (1) or pass (0); returns the final
 * drop. A protected packet takes a drop verdict as a pass when its wt
 * fits under protect_budget, and adds it to the window's debt; any other
 * packet takes a pass verdict as a drop while the debt is positive, and
 * pays off up to wt of it.
 *
 * The bound: every change to the debt is one compare-and-swap from a value
 * the packet read to a value computed from it, within [0, protect_budget]
 * (a payer never below 0, a protected add never above the budget), so the
 * debt is in [0, protect_budget] at every instant, with any number of CPUs,
 * and protection never gives the collector more than protect_budget extra
 * packets per window. A swap that loses to another CPU retries with the
 * value it found, at most TL_DEBT_TRIES times; a packet whose tries all
 * lose keeps its tier verdict (a protected drop stays a drop, an unpaid
 * pass stays a pass), which never moves the debt out of its bounds.
 * TestDebtModel (bpf/debt_model_test.go, this function's steps) checks
 * every interleaving of 2 or 3 CPUs' packets at budgets 1 and 2. A reload
 * that lowers the budget below the debt lets payers pay it down; no
 * protected packet passes until it is under. */
static __always_inline int severity_verdict(struct tl_window *w, const struct tl_settings *s, __u32 cls,
					    int drop, __u64 bytes, __u32 segs, __u32 wt)
{
	__u64 d = READ_ONCE(w->debt);
	if (drop && cls == TL_SEV_PROTECTED) {
		__u64 budget = s->protect_budget;
#pragma unroll
		for (int i = 0; i < TL_DEBT_TRIES; i++) {
			if (d > budget || wt > budget - d)
				return drop;
			__u64 seen = __sync_val_compare_and_swap(&w->debt, d, d + wt);
			if (seen == d) {
				count(&severity_stats, TL_SEV_PROTECTED_PASS, segs, bytes);
				return 0;
			}
			d = seen;
		}
		return drop;
	}
	if (drop || cls == TL_SEV_PROTECTED)
		return drop;
#pragma unroll
	for (int i = 0; i < TL_DEBT_TRIES; i++) {
		if ((__s64)d <= 0)
			return drop;
		__u64 seen = __sync_val_compare_and_swap(&w->debt, d, d > wt ? d - wt : 0);
		if (seen == d) {
			count(&severity_stats, TL_SEV_PAID_DROP, segs, bytes);
			return 1;
		}
		d = seen;
	}
	return drop;
}

/* The verdict of a selected UDP datagram under a policy with a severity
 * block (docs/design.md §7): sev is its <PRI>'s severity (parse_pri, -1 for
 * none), tier and thr its tier-table entry. Shed-first datagrams take the
 * threshold of shed_drops[tier]; then severity_verdict applies the drop
 * debt, and the class and verdict are counted in severity_stats. s and w
 * are the caller's settings and window; a super-packet's segs datagrams are
 * counted as segs, and charged as wt. Returns TL_PASS, TL_DROP or TL_WOULD_DROP. */
static __always_inline __u32 tl_severity_judge(const struct tl_settings *s, struct tl_window *w, int sev,
					       __u32 tier, __u32 thr, __u64 bytes, __u32 segs, __u32 wt)
{
	__u32 cls = TL_SEV_NORMAL;
	if (sev >= 0 && sev < 8)
		cls = s->sev_class[sev & 7];
	if (cls == TL_SEV_SHED_FIRST) {
		/* The mask bounds the index for verifiers that do not carry the
		 * clamp's range over a register copy (Linux 6.1); the clamp keeps
		 * it in the array. */
		tier &= 0x1f;
		if (tier > TL_MAX_TIERS)
			tier = TL_MAX_TIERS;
		thr = s->shed_drops[tier];
	}
	__u32 verdict = TL_PASS;
	if (s->mode != TL_MODE_OFF && severity_verdict(w, s, cls, draw_drop(thr), bytes, segs, wt))
		verdict = mode_verdict(s);
	if (cls >= TL_SEV_CLASSES)
		cls = TL_SEV_NORMAL;
	count(&severity_stats, cls * TL_VERDICTS + verdict, segs, bytes);
	return verdict;
}

#endif /* __TL_SEVERITY_H */
