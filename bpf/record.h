/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The shed record (docs/design.md §10): samples of shed packets (dropped, or
 * would_drop in dry-run) for the agent, at most tl_settings.rec_samples per
 * second in all, whatever the flood and the number of CPUs.
 *
 * One gate shared by all CPUs (record_gate, record_token) spaces the
 * samples: read by every shed packet, written only by sampled ones, so a
 * flood on any number of CPUs shares one cap, and a flood on one CPU gets
 * all of it. A sample is one reservation in the ring buffer shed_samples
 * (maps.h says why a ring buffer), filled in place and submitted, and
 * counted in this CPU's record_cpu.
 *
 * The callers, where verdicts are final (tl_judge, source_budget,
 * follow_fragment), check a shed packet against the cap (record_token)
 * only when rec_samples is set, and call tl_record only for one the cap
 * lets through: with sampling off a shed packet pays one load and compare,
 * an unsampled one the gate's check, and a packet that passes nothing. */
#ifndef __TL_RECORD_H
#define __TL_RECORD_H

#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "severity.h"

/* tl_record's meta argument, bit 0 first:
 *   0..7 offset of the L3 header from data   8 1 for IPv6
 *  16..23 tier     24..31 reason (enum tl_reason)
 *  32..39 verdict  40..47 the <PRI> 0..191 (parse_pri), or more for none
 *  48..55 the active slot the caller judged with */
static __always_inline __u64 record_meta(const struct pkt *p, void *data, __u32 slot, __u32 tier,
					 __u32 reason, __u32 verdict, int pri)
{
	return ((__u64)((void *)p->l3 - data) & 0xff) | (__u64)(p->l3proto == ETH_P_IPV6) << 8 |
	       (__u64)(tier & 0xff) << 16 | (__u64)(reason & 0xff) << 24 | (__u64)(verdict & 0xff) << 32 |
	       (__u64)(pri & 0xff) << 40 | (__u64)(slot & (TL_SLOTS - 1)) << 48;
}

/* Whether the cap lets this shed packet be sampled, for a caller that has
 * checked that rec_samples is set (with it 0, tau and interval are 0 and
 * every shed packet would be sampled: bpf's TestRecordNothingOnPass sees a
 * caller that forgot): the generic cell rate
 * algorithm (ITU-T I.371) on the shared gate. A packet at time now
 * conforms when now ≥ tat − tau; the first CPU to move tat on (to
 * max(tat, now) + interval) by compare-and-swap takes the sample. Over any
 * span t the gate passes at most t / interval + burst (tau / interval + 1)
 * samples, whatever the CPUs: rec_samples × t + burst. With the tick clock
 * a span is measured in whole ticks, at most one tick longer than it is:
 * rec_samples × (t + tick) + burst.
 *
 * An unsampled shed packet reads the clock and tat and compares: the
 * gate's line is written at most rec_samples times a second plus the
 * swaps that lose a race for a sample, so the CPUs keep it in their caches.
 * Accepted race: the losers of a swap skip their sample; there was one
 * token and another CPU took it.
 *
 * While the gate has a token, a shed packet takes it with probability
 * tl_record_share (maps.h): the sample is a random one of the shed
 * packets that follow the token, not the first. Only packets that find a
 * token draw: under a flood, about the share's fraction of a token's wait
 * (with tl_record_share at 4 × the cap over the shed rate, a quarter). */
/* How far past now + tau + interval a tat may be on this clock (a tick at
 * most, 10 ms at HZ 100) before record_token reads it as the other
 * clock's. */
#define TL_REC_CLOCK_SLACK_NS 1000000000ULL

static __always_inline int record_token(const struct tl_settings *s)
{
	__u32 zero = 0;
	struct tl_record_gate *g = bpf_map_lookup_elem(&record_gate, &zero);
	if (!g)
		return 0;
	__u64 now = s->rec_tick_ns ? bpf_jiffies64() * s->rec_tick_ns : bpf_ktime_get_ns();
	__u64 tat = READ_ONCE(g->tat), from = tat;
	__s64 ahead = tat - now;
	if (ahead > (__s64)s->rec_tau_ns) {
		/* The gate never moves tat past now + tau + interval (a tick
		 * more on the tick clock): one further ahead was set on the
		 * other clock (the gate is pinned; an agent restarted with or
		 * without the tick gate swaps jiffies × tick for ktime, ~199
		 * days apart), and would take no sample until this clock
		 * caught up. The gate starts again from now. */
		if (ahead <= (__s64)(s->rec_tau_ns + s->rec_interval_ns + TL_REC_CLOCK_SLACK_NS))
			return 0;
		tat = now;
	}
	__u32 share = tl_record_share;
	if (share != TL_THR_ALWAYS && bpf_get_prandom_u32() >= share)
		return 0;
	__u64 next = ((__s64)(tat - now) > 0 ? tat : now) + s->rec_interval_ns;
	return __sync_bool_compare_and_swap(&g->tat, from, next);
}

/* The words of IPv6 transition prefixes as group_of6 loads them
 * (little-endian loads of network-order bytes, as tiers.Compile's masks). */
#define TL_NAT64_W0 0x9bff6400  /* 64:ff9b::/96 (RFC 6052): word 0 */
#define TL_MAPPED_W2 0xffff0000 /* ::ffff:0:0/96 (IPv4-mapped): word 2 */
#define TL_6TO4_W0 0x0220       /* 2002::/16 (RFC 3056): word 0's low half */

/* The source group of the IPv6 source a (its four words as they lie in the
 * header) into out, with the IPv4 and IPv6 group masks; returns its
 * family, 4 or 6. A source that carries an IPv4 sender's address (NAT64's
 * well-known prefix 64:ff9b::/96, IPv4-mapped ::ffff:0:0/96, 6to4
 * 2002::/16) is grouped as that IPv4 address under mask4, so that every
 * IPv4 sender behind a NAT64 or 6to4 relay is its own group, as it would
 * be over IPv4 (tiers.SourceBudget.Group). Source budgets
 * (sources.h source_group) and shed samples (record_group) share it, so
 * that a sample names the group its budget charged. */
static __always_inline __u32 group_of6(const __u32 *a, __u32 mask4, const __u32 *mask6, __u32 *out)
{
	/* Word loads, as of iphdr's saddr: XDP does not enforce alignment. */
	__u32 a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
	/* Branch-free, so that the verifier follows one path from here on
	 * for every IPv6 source (a branch cost 24k instructions,
	 * TestVerifierComplexity): TL_IS_ZERO(v) is 1 for v == 0, else 0;
	 * e46 marks 64:ff9b::/96 and ::ffff:0:0/96, e2002 marks 2002::/16,
	 * v4 is the IPv4 address either carries, and keep6 is all ones for
	 * any other IPv6 source. */
#define TL_IS_ZERO(v) ((((__u64)(__u32)(v)) - 1) >> 63)
	__u64 e46 = TL_IS_ZERO((a0 ^ TL_NAT64_W0) | a1 | a2) | TL_IS_ZERO(a0 | a1 | (a2 ^ TL_MAPPED_W2));
	__u64 e2002 = TL_IS_ZERO((a0 & 0xffff) ^ TL_6TO4_W0) & (e46 ^ 1);
#undef TL_IS_ZERO
	__u32 v4 = (__u32)(e46 * a3 + e2002 * ((a0 >> 16) | (a1 << 16)));
	__u32 keep6 = (__u32)((e46 | e2002) - 1);
	out[0] = ((v4 & mask4) & ~keep6) | (a0 & mask6[0] & keep6);
	out[1] = a1 & mask6[1] & keep6;
	out[2] = a2 & mask6[2] & keep6;
	out[3] = a3 & mask6[3] & keep6;
	return 4 + (2 & keep6);
}

/* The source group of the frame's L3 header at off, as source budgets
 * group it (group_of6), with the rec_ masks; none when off is 0: a frame
 * with more VLAN tags than the parser walks has no L3 header it knows. */
static __always_inline void record_group(struct tl_sample *smp, const struct tl_settings *s, void *data,
					 void *end, __u32 off, int ipv6)
{
	if (!off)
		return;
	if (ipv6) {
		const struct ipv6hdr *ip6 = data + off;
		if ((void *)(ip6 + 1) > end)
			return;
		smp->family = group_of6((const __u32 *)&ip6->saddr, s->rec_mask4, s->rec_mask6, smp->group);
		smp->prefix = smp->family == 4 ? s->rec_prefixes & 0xff : s->rec_prefixes >> 8;
		return;
	}
	const struct iphdr *ip = data + off;
	if ((void *)(ip + 1) > end)
		return;
	smp->group[0] = ip->saddr & s->rec_mask4;
	smp->family = 4;
	smp->prefix = s->rec_prefixes;
}

/* Copies the frame's first caplen bytes (caplen ≤ TL_RECORD_SNAP_MAX and
 * ≤ the frame) into the sample: whole words, then the tail. A loop the
 * verifier walks, rather than bpf_xdp_load_bytes, which needs Linux 5.18. */
static __always_inline void record_copy(struct tl_sample *smp, __u8 *data, void *end, __u32 caplen)
{
	__u32 i = 0;
	for (; i < TL_RECORD_SNAP_MAX; i += 8) {
		if (i + 8 > caplen || (void *)(data + i + 8) > end)
			break;
		*(__u64 *)&smp->data[i] = *(__u64 *)(data + i);
	}
	for (int j = 0; j < 8; j++, i++) {
		if (i >= caplen || i >= TL_RECORD_SNAP_MAX || (void *)(data + i + 1) > end)
			break;
		smp->data[i] = data[i];
	}
}

/* Samples a shed packet if this CPU's bucket has a token: its verdict from
 * meta (record_meta), its pass probability from thr, the drop threshold
 * it was drawn at (stored as ~thr: docs/design.md §10), the rest from the
 * frame and the settings of the caller's slot.
 * Returns 1 when a sample was written. Call it only for a packet the cap
 * let through (record_token), so that an unsampled one pays no call.
 *
 * A global function: the verifier checks it once, with meta unknown, and
 * the paths that call it pay a call. */
__noinline int tl_record(struct xdp_md *ctx, __u64 meta, __u32 thr)
{
	TL_FN(TL_RECORD);
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 slot = (meta >> 48) & (TL_SLOTS - 1), zero = 0;
	struct tl_settings *s = bpf_map_lookup_elem(&settings, &slot);
	if (!s)
		return 0;
	struct tl_record_cpu *rc = bpf_map_lookup_elem(&record_cpu, &zero);
	if (!rc)
		return 0;
#ifndef TL_RECORD_PERF
	struct tl_sample *smp = bpf_ringbuf_reserve(&shed_samples, sizeof(*smp), 0);
	if (!smp) {
		rc->lost++;
		return 0;
	}
	rc->sampled++;
#else
	struct tl_sample *smp = bpf_map_lookup_elem(&record_scratch, &zero);
	if (!smp)
		return 0;
#endif

	__u32 len = data_end - data;
	__u32 caplen = len < s->rec_snaplen ? len : s->rec_snaplen;
	if (caplen > TL_RECORD_SNAP_MAX)
		caplen = TL_RECORD_SNAP_MAX;
	__u32 pri = (meta >> 40) & 0xff;
	__u32 cls = TL_SEV_NORMAL;
	if (s->sev_on)
		cls = pri_class(s, pri);
	__u32 reason = (meta >> 24) & 0xff;
	if (reason == TL_REASON_TIER && cls == TL_SEV_SHED_FIRST)
		reason = TL_REASON_SHED_FIRST;

	smp->time_ns = bpf_ktime_get_ns();
	smp->ifindex = ctx->ingress_ifindex;
	smp->len = len;
	smp->caplen = caplen;
	smp->tier = (meta >> 16) & 0xff;
	smp->reason = reason;
	smp->verdict = (meta >> 32) & 0xff;
	smp->sev = pri <= 191 ? pri & 7 : TL_RECORD_NONE;
	smp->facility = pri <= 191 ? pri >> 3 : TL_RECORD_NONE;
	smp->sev_class = cls;
	smp->family = 0;
	smp->prefix = 0;
	smp->format = TL_SAMPLE_FORMAT;
	smp->pass = ~thr;
	__builtin_memset(smp->_pad, 0, sizeof(smp->_pad));
	__builtin_memset(smp->group, 0, sizeof(smp->group));
	record_group(smp, s, data, data_end, meta & 0xff, (meta >> 8) & 1);
#ifndef TL_RECORD_PERF
	record_copy(smp, data, data_end, caplen);
	bpf_ringbuf_submit(smp, 0);
#else
	/* The header from the scratch sample, the frame's first caplen bytes
	 * (≤ its length) appended by the kernel. */
	if (bpf_perf_event_output(ctx, &shed_samples, (__u64)caplen << TL_F_CTX_LEN_SHIFT | TL_F_CURRENT_CPU, smp,
				  __builtin_offsetof(struct tl_sample, data)) < 0) {
		rc->lost++;
		return 0;
	}
	rc->sampled++;
#endif
	return 1;
}

#endif /* __TL_RECORD_H */
