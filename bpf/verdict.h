/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Verdicts and counters: the mode's verdict for a packet to drop, the
 * random draw against a threshold, count(), the verdict of an unselected
 * packet, and the fragment memory that lets followers share their first's
 * verdict (docs/design.md §2; the fragments' own verdicts are in fragments.h).
 * Also the benchmark stage stops (TL_STAGE). */
#ifndef __TL_VERDICT_H
#define __TL_VERDICT_H

#include "maps.h"
#include "parse.h"

/* Cost attribution, for benchmarks only (bpf BenchmarkStages). Built with
 * -DTL_BENCH_STAGES (the limiterStages object, gen.go), a program loaded
 * with tl_bench_stage = N returns ret at TL_STAGE(N, ret), so that the
 * cost of a path can be split by stage (enum tl_stage), each measured
 * beside a bare program. ret is what stops the packet (XDP_DROP) in the
 * contract of the function the stop is in. The limiter itself is built
 * without it, and TL_STAGE is nothing there. */
#ifdef TL_BENCH_STAGES
volatile const __u32 tl_bench_stage = 0;
#define TL_STAGE(n, ret)                             \
	do {                                         \
		if (tl_bench_stage == (n))           \
			return (ret);                \
	} while (0)
#else
#define TL_STAGE(n, ret) do { } while (0)
#endif

/* Adds a frame of packets datagrams and bytes to counter key of a per-CPU
 * stats map (struct tl_stat): plain adds, only this CPU writes its value. */
static __always_inline void count(void *map, __u32 key, __u32 packets, __u64 bytes)
{
	/* A key the verifier knows would make it track the exact value of
	 * every field the key came from (the parser's, on every path):
	 * tl_opaque hides it (cursor.h). */
	key += tl_opaque;
	struct tl_stat *st = tl_lookup_percpu(map, &key);
	if (st) {
		st->packets += packets;
		st->bytes += bytes;
	}
}

/* The verdict of a packet the policy would drop: dropped in enforce mode,
 * would_drop (and passed) in dry-run, passed in mode off. Written so that
 * a caller that has already tested mode != TL_MODE_OFF pays one compare. */
static __always_inline __u32 mode_verdict(const struct tl_settings *s)
{
	return s->mode == TL_MODE_ENFORCE ? TL_DROP : s->mode == TL_MODE_OFF ? TL_PASS : TL_WOULD_DROP;
}

/* The random draw against a drop threshold on the bpf_get_prandom_u32()
 * scale: TL_THR_NEVER never drops and TL_THR_ALWAYS always does, neither
 * taking a draw. */
static __always_inline int draw_drop(__u32 thr)
{
	return thr != TL_THR_NEVER && (thr == TL_THR_ALWAYS || bpf_get_prandom_u32() < thr);
}

/* The XDP action of a verdict: would_drop passes. */
static __always_inline __u32 xdp_action(__u32 verdict)
{
	return verdict == TL_DROP ? XDP_DROP : XDP_PASS;
}

/* The identity of a fragment's datagram: family, addresses, id and the
 * protocol the fragment declares (RFC 791 §3.2, RFC 8200 §4.5). */
static __always_inline void frag_key(const struct pkt *p, struct tl_frag_key *k)
{
	load_addr(p, 0, k->src);
	load_addr(p, 1, k->dst);
	k->id = p->frag_id;
	k->proto = p->frag_proto;
	k->family = p->l3proto;
}

/* A first fragment: remember a drop for its followers, until
 * TL_FRAG_TTL_MS from now; any other verdict replaces what was remembered
 * for the same identity (an earlier datagram that reused the id). */
static __always_inline void remember_first(const struct pkt *p, __u32 verdict)
{
	struct tl_frag_key k = {};
	frag_key(p, &k);
	if (verdict == TL_DROP) {
		struct tl_frag_verdict v = {
			.expires_ns = bpf_ktime_get_ns() + TL_FRAG_TTL_MS * 1000000ULL,
		};
		bpf_map_update_elem(&frag_verdicts, &k, &v, BPF_ANY);
	} else {
		bpf_map_delete_elem(&frag_verdicts, &k);
	}
}

/* A packet no select rule counts (or that cannot be judged): it passes,
 * counted as unselected, and a first fragment's followers pass with it. */
static __always_inline int pass_unselected(const struct pkt *p, __u64 bytes)
{
	if (p->frag == FRAG_FIRST && follows_first(p))
		remember_first(p, TL_PASS);
	count(&misc_stats, TL_MISC_UNSELECTED, 1, bytes);
	return XDP_PASS;
}

#endif /* __TL_VERDICT_H */
