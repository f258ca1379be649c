//go:build ignore
/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* tierlimit: an XDP tiered load shedder for log collectors.
 *
 * Selected packets (an L4 protocol and destination port, optionally narrowed
 * to destination prefixes) are counted in one window shared by all CPUs. The
 * count n of a packet indexes a tier table compiled by the agent; the table
 * entry holds the tier and its drop threshold on the bpf_get_prandom_u32()
 * scale. Everything else passes untouched. DESIGN.md §2 has the semantics. */

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"
#include "consts.h"
#include "types.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Never read: puts the shared enums in BTF for bpf2go (types.h). */
const struct tl_contract *tl_contract_btf __attribute__((unused));

#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))

/* The active policy slot: 0 or 1. The agent writes the other slot's settings,
 * table and selectors, then flips this with one map update. 0 and 1 differ in
 * one byte, so however the kernel copies the value, a packet reads either the
 * old slot or the new one. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} active_slot SEC(".maps");

/* struct tl_settings of each slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_SLOTS);
	__type(key, __u32);
	__type(value, struct tl_settings);
} settings SEC(".maps");

/* The compiled tier tables: slot s holds entries [s*TL_TABLE_MAX, s*TL_TABLE_MAX + table_len). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_SLOTS * TL_TABLE_MAX);
	__type(key, __u32);
	__type(value, struct tl_entry);
} tier_table SEC(".maps");

/* Port selectors: key (slot * 2 + is_tcp) * TL_PORT_KEYS + destination port. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_SLOTS * 2 * TL_PORT_KEYS);
	__type(key, __u32);
	__type(value, struct tl_port);
} ports SEC(".maps");

/* Exempt source prefixes, tag = slot. The value is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, TL_LPM_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct tl_lpm_key);
	__type(value, __u8);
} exempt_sources SEC(".maps");

/* Destination prefixes of select rules that have dests, tag = slot << TL_DEST_RULE_BITS | rule. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, TL_LPM_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct tl_lpm_key);
	__type(value, __u8);
} select_dests SEC(".maps");

/* The window shared by all CPUs: one struct tl_window. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_window);
} window SEC(".maps");

/* Selected packets by [tier * TL_VERDICTS + verdict], per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, (TL_MAX_TIERS + 1) * TL_VERDICTS);
	__type(key, __u32);
	__type(value, struct tl_stat);
} stats SEC(".maps");

/* Packets that never enter the window, by enum tl_misc, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_MISC_MAX);
	__type(key, __u32);
	__type(value, struct tl_stat);
} misc_stats SEC(".maps");

/* Verdict (TL_PASS or TL_DROP) of recent first fragments, for their followers. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, TL_FRAG_ENTRIES);
	__type(key, struct tl_frag_key);
	__type(value, __u32);
} frag_verdicts SEC(".maps");

/* Packets of a saturated window counted per CPU, indexed by
 * bpf_get_smp_processor_id(): struct tl_overflow (window_count). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_MAX_CPUS);
	__type(key, __u32);
	__type(value, struct tl_overflow);
} overflow SEC(".maps");

enum {
	FRAG_NONE = 0,
	FRAG_FIRST = 1, /* offset 0, more fragments follow */
	FRAG_NEXT = 2,  /* offset > 0: no L4 header */
};

/* A header cursor: each parse_* checks bounds, then advances pos. */
struct cursor {
	void *pos;
	void *end;
};

/* What the parsers learnt of a packet. */
struct pkt {
	void *l3;      /* the IPv4 or IPv6 header, bounds checked */
	__u32 frag_id; /* IP identification, for fragments */
	__u16 l3proto; /* ETH_P_IP or ETH_P_IPV6 */
	__u16 dport;   /* host order */
	__u8 l4proto;
	__u8 frag; /* FRAG_* */
	__u8 syn;  /* TCP SYN without ACK */
};

/* Ethernet and up to TL_VLAN_MAX VLAN tags. Returns the EtherType of the
 * payload in host order, or -1 when truncated or nested too deep. */
static __always_inline int parse_eth(struct cursor *c)
{
	struct ethhdr *eth = c->pos;
	if ((void *)(eth + 1) > c->end)
		return -1;
	c->pos = eth + 1;
	__u16 proto = bpf_ntohs(eth->h_proto);

#pragma unroll
	for (int i = 0; i < TL_VLAN_MAX; i++) {
		if (proto != ETH_P_8021Q && proto != ETH_P_8021AD)
			return proto;
		struct vlan_hdr *vh = c->pos;
		if ((void *)(vh + 1) > c->end)
			return -1;
		c->pos = vh + 1;
		proto = bpf_ntohs(vh->h_vlan_encapsulated_proto);
	}
	if (proto == ETH_P_8021Q || proto == ETH_P_8021AD)
		return -1;
	return proto;
}

/* IPv4 with IHL validated and options skipped. Returns the L4 protocol, or
 * -1 when truncated or malformed (version, IHL < 5, total length < IHL). */
static __always_inline int parse_ipv4(struct cursor *c, struct pkt *p)
{
	struct iphdr *ip = c->pos;
	if ((void *)(ip + 1) > c->end)
		return -1;
	if (ip->version != 4 || ip->ihl < 5)
		return -1;
	__u32 hlen = ip->ihl * 4;
	if (bpf_ntohs(ip->tot_len) < hlen)
		return -1;
	if (c->pos + hlen > c->end)
		return -1;
	c->pos += hlen;

	__u16 off = bpf_ntohs(ip->frag_off);
	if (off & IP_OFFSET)
		p->frag = FRAG_NEXT;
	else if (off & IP_MF)
		p->frag = FRAG_FIRST;
	p->frag_id = bpf_ntohs(ip->id);
	p->l3 = ip;
	p->l3proto = ETH_P_IP;
	return ip->protocol;
}

static __always_inline int ipv6_is_ext(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS ||
	       nh == IPPROTO_FRAGMENT;
}

/* IPv6 and up to TL_IPV6_EXT_MAX extension headers (hop-by-hop, routing,
 * destination options, fragment; RFC 8200 §4). Returns the upper-layer
 * protocol, or -1 when truncated or the chain is longer than we walk. Stops
 * at a non-first fragment, whose payload holds no header. */
static __always_inline int parse_ipv6(struct cursor *c, struct pkt *p)
{
	struct ipv6hdr *ip6 = c->pos;
	if ((void *)(ip6 + 1) > c->end)
		return -1;
	if (ip6->version != 6)
		return -1;
	c->pos = ip6 + 1;
	p->l3 = ip6;
	p->l3proto = ETH_P_IPV6;
	__u8 nh = ip6->nexthdr;

	for (int i = 0; i < TL_IPV6_EXT_MAX; i++) {
		if (nh == IPPROTO_FRAGMENT) {
			struct frag_hdr *fh = c->pos;
			if ((void *)(fh + 1) > c->end)
				return -1;
			c->pos = fh + 1;
			nh = fh->nexthdr;
			__u16 off = bpf_ntohs(fh->frag_off);
			p->frag_id = bpf_ntohl(fh->identification);
			if (off & IP6_OFFSET) {
				p->frag = FRAG_NEXT;
				return nh;
			}
			if (off & IP6_MF)
				p->frag = FRAG_FIRST;
		} else if (ipv6_is_ext(nh)) {
			struct ipv6_opt_hdr *oh = c->pos;
			if ((void *)(oh + 1) > c->end)
				return -1;
			__u32 len = ((__u32)oh->hdrlen + 1) * 8;
			nh = oh->nexthdr;
			if (c->pos + len > c->end)
				return -1;
			c->pos += len;
		} else {
			return nh;
		}
	}
	return ipv6_is_ext(nh) ? -1 : nh;
}

/* UDP: returns 0 with the destination port, or -1 when truncated. */
static __always_inline int parse_udp(struct cursor *c, struct pkt *p)
{
	struct udphdr *udp = c->pos;
	if ((void *)(udp + 1) > c->end)
		return -1;
	c->pos = udp + 1;
	p->dport = bpf_ntohs(udp->dest);
	return 0;
}

/* TCP: returns 0 with the destination port and the SYN-without-ACK bit, or
 * -1 when the header (options included) is truncated or doff < 5. */
static __always_inline int parse_tcp(struct cursor *c, struct pkt *p)
{
	struct tcphdr *tcp = c->pos;
	if ((void *)(tcp + 1) > c->end)
		return -1;
	if (tcp->doff < 5)
		return -1;
	if (c->pos + tcp->doff * 4 > c->end)
		return -1;
	c->pos += tcp->doff * 4;
	p->dport = bpf_ntohs(tcp->dest);
	p->syn = tcp->syn && !tcp->ack;
	return 0;
}

/* Writes the source (dst = 0) or destination address as 16 bytes, IPv4 as
 * IPv4-mapped IPv6 (RFC 4291 §2.5.5.2). */
static __always_inline void load_addr(const struct pkt *p, int dst, __u8 out[16])
{
	if (p->l3proto == ETH_P_IP) {
		const struct iphdr *ip = p->l3;
		__u32 a = dst ? ip->daddr : ip->saddr;
		__builtin_memset(out, 0, 10);
		out[10] = 0xff;
		out[11] = 0xff;
		__builtin_memcpy(out + 12, &a, 4);
	} else {
		const struct ipv6hdr *ip6 = p->l3;
		__builtin_memcpy(out, dst ? &ip6->daddr : &ip6->saddr, 16);
	}
}

static __always_inline void frag_key(const struct pkt *p, struct tl_frag_key *k)
{
	load_addr(p, 0, k->src);
	load_addr(p, 1, k->dst);
	k->id = p->frag_id;
	k->proto = p->l4proto;
}

static __always_inline void count(void *map, __u32 key, __u64 bytes)
{
	struct tl_stat *st = bpf_map_lookup_elem(map, &key);
	if (st) {
		st->packets++;
		st->bytes += bytes;
	}
}

/* Does a select rule of this slot count the packet? */
static __always_inline int is_selected(const struct pkt *p, __u32 slot, const struct tl_settings *s)
{
	__u32 key = (slot * 2 + (p->l4proto == IPPROTO_TCP)) * TL_PORT_KEYS + p->dport;
	struct tl_port *pe = bpf_map_lookup_elem(&ports, &key);
	if (!pe)
		return 0;
	if (pe->flags & TL_PORT_PACKETS)
		return 1;
	if ((pe->flags & TL_PORT_SYN) && p->syn)
		return 1;

	__u32 rules = pe->cidr_rules;
	if (!rules)
		return 0;
	struct tl_lpm_key k = { .prefixlen = TL_LPM_TAG_BITS + TL_LPM_ADDR_BITS };
	load_addr(p, 1, k.addr);
	for (__u32 i = 0; i < TL_MAX_RULES; i++) {
		if (!(rules & (1U << i)))
			continue;
		if ((s->syn_rules & (1U << i)) && !p->syn)
			continue;
		k.tag = slot << TL_DEST_RULE_BITS | i;
		if (bpf_map_lookup_elem(&select_dests, &k))
			return 1;
	}
	return 0;
}

static __always_inline int is_exempt(const struct pkt *p, __u32 slot)
{
	struct tl_lpm_key k = { .prefixlen = TL_LPM_TAG_BITS + TL_LPM_ADDR_BITS, .tag = slot };
	load_addr(p, 0, k.addr);
	return bpf_map_lookup_elem(&exempt_sources, &k) != NULL;
}

/* Counts a packet of window id on this CPU's overflow slot. Returns 0 when
 * the CPU has no slot (numbered TL_MAX_CPUS or more): the caller counts it
 * on the shared count instead. Only this CPU writes its slot. The first
 * packet of a window on a CPU reuses the slot of window id - 2, and marks
 * the window as overflowed (a store to the shared line, once per window
 * unless CPUs race to it, all storing the same value). */
static __always_inline int overflow_add(struct tl_window *w, __u64 id)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	if (!o)
		return 0;
	__u32 i = id & 1;
	if (o->window[i] != id) {
		o->window[i] = id;
		o->packets[i] = 0;
		if (READ_ONCE(w->overflowed) != id + 1)
			w->overflowed = id + 1;
	}
	o->packets[i]++;
	return 1;
}

/* The packets of window id that all CPUs counted in the overflow map. */
static __always_inline __u64 overflow_sum(__u64 id, const struct tl_settings *s)
{
	__u32 i = id & 1;
	__u64 sum = 0;
	for (__u32 cpu = 0; cpu < TL_MAX_CPUS; cpu++) {
		if (cpu >= s->nr_cpus)
			break;
		struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
		if (!o)
			break;
		if (o->window[i] == id)
			sum += o->packets[i];
	}
	return sum;
}

/* Counts a selected packet in the shared window and returns its n (1-based).
 *
 * The seed's rule: a window opens at the first selected packet that arrives
 * more than window_ns after the current window opened, on bpf_ktime_get_ns.
 * The CPU whose compare-and-swap moves start_ns opens it and resets the
 * count to 1.
 *
 * The tick gate: bpf_ktime_get_ns costs more than the whole parse, while
 * bpf_jiffies64 is one load. If fewer than window_jiffies ticks (window_ns
 * divided by the tick, rounded down) passed since the window opened, then
 * less than window_ns did and the window cannot have expired, so the clock
 * is not read. Only packets in a window's last tick read it, and the rule
 * stays exact to the nanosecond. start_jiffies is read before the clock, so
 * it never runs ahead of start_ns. If jiffies lag (a tickless CPU that has
 * not caught up yet), a window may open late by that lag; the agent sets
 * window_jiffies = 0, which disables the gate, where the tick is unknown.
 *
 * The saturated window: every packet with n >= last_n (the first n of the
 * table's last entry) is in the last entry, whatever its exact n. A packet
 * that reads count + 1 >= last_n therefore skips the atomic add: it counts
 * itself in its CPU's overflow slot for this window (no shared write, so
 * the window's cache line stays shared, read-mostly, on every CPU) and
 * takes n = count + 1, which is at least last_n and at most its true n.
 * The shared add is thus needed only for the first last_n packets of a
 * window, whatever the flood's rate. Below last_n, n stays exact: count
 * only grows within a window, so every packet that reads count + 1 >=
 * last_n comes after all packets whose add returned less. The window's
 * offered load is count plus the overflow of all CPUs for this window,
 * summed by the agent (bpf.Limiter.Window). A packet that takes the atomic
 * add in a window that has overflow (after a reload raised last_n) adds the
 * overflow of all CPUs to its n, so n stays exact across the reload. The
 * overflow then no longer grows (but for packets still judged by the old
 * policy in those microseconds), and every packet takes the add and that
 * sum, nr_cpus loads, until the shared count alone reaches the new last_n
 * or the window ends: the price of a reload that raises max mid-flood.
 *
 * Accepted race: between the opener's CAS on start_ns and its exchange of
 * count, another CPU may read the new start_ns and add to the old count; the
 * exchange then erases that increment, so the new window undercounts by the
 * packets other CPUs count in those few nanoseconds (at most one per other
 * CPU in practice). Those packets were judged at the old window's n, the
 * tier the offered load was in. start_jiffies, last_count and opened are
 * plain stores by the single opener; a CPU that reads a stale start_jiffies
 * only takes the exact path.
 *
 * The overflow count adds no loss of its own. A packet reads opened (the
 * window id), count and overflowed in that order; the opener clears
 * overflowed, exchanges count, then increments opened. So a packet that
 * reads the new id also reads the new window's count, and one that reads
 * the old window's saturated count files itself under the old id, where
 * the agent adds it to last_count; one that reads the new count also reads
 * the cleared overflowed, so it never adds the old window's overflow to its
 * n. One race remains: a packet that reads the old id but the new window's
 * count (between the exchange and the increment) and finds that count
 * already saturated, which only a policy with last_n <= 2 allows, files
 * itself under the old window, which then counts one packet per racing CPU
 * more and the new one as many fewer; its verdict is the last tier's
 * either way. These orders are x86's (loads in program order, stores in
 * program order); on arm64 the JIT does not order plain loads, and a packet
 * that sees them out of order is misfiled the same way, one per other CPU
 * per window opening at most. */
static __always_inline __u64 window_count(struct tl_window *w, const struct tl_settings *s)
{
	__u64 jiffies = 0;

	if (s->window_jiffies) {
		jiffies = bpf_jiffies64();
		if (jiffies - READ_ONCE(w->start_jiffies) < s->window_jiffies)
			goto count;
	}

	__u64 now = bpf_ktime_get_ns();
	__u64 start = READ_ONCE(w->start_ns);
	if ((__s64)(now - start) > (__s64)s->window_ns &&
	    __sync_bool_compare_and_swap(&w->start_ns, start, now)) {
		w->start_jiffies = jiffies;
		w->overflowed = 0;
		w->last_count = __sync_lock_test_and_set(&w->count, 1);
		w->opened++;
		return 1;
	}
count:;
	__u64 id = READ_ONCE(w->opened);
	__u64 c = READ_ONCE(w->count);
	if (c + 1 >= s->last_n && overflow_add(w, id))
		return c + 1;
	__u64 overflowed = READ_ONCE(w->overflowed);
	__u64 n = __sync_fetch_and_add(&w->count, 1) + 1;
	if (overflowed == id + 1 && n < s->last_n)
		n += overflow_sum(id, s);
	return n;
}

/* A non-first fragment carries no L4 header: it is never counted, and takes
 * the verdict of its first fragment when that was seen (DESIGN.md §2). */
static __always_inline int follow_fragment(struct pkt *p, __u64 bytes)
{
	struct tl_frag_key k = {};
	frag_key(p, &k);
	__u32 *v = bpf_map_lookup_elem(&frag_verdicts, &k);
	if (v && *v == TL_DROP) {
		count(&misc_stats, TL_MISC_FRAG_DROP, bytes);
		return XDP_DROP;
	}
	count(&misc_stats, TL_MISC_FRAG_PASS, bytes);
	return XDP_PASS;
}

SEC("xdp")
int tierlimit(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 bytes = data_end - data;
	struct cursor c = { .pos = data, .end = data_end };
	struct pkt p = {};
	int l4;

	switch (parse_eth(&c)) {
	case ETH_P_IP:
		l4 = parse_ipv4(&c, &p);
		break;
	case ETH_P_IPV6:
		l4 = parse_ipv6(&c, &p);
		break;
	default:
		goto unselected;
	}
	if (l4 != IPPROTO_UDP && l4 != IPPROTO_TCP)
		goto unselected;
	p.l4proto = l4;
	if (p.frag == FRAG_NEXT)
		return follow_fragment(&p, bytes);
	if ((l4 == IPPROTO_UDP ? parse_udp(&c, &p) : parse_tcp(&c, &p)) < 0)
		goto unselected;

	__u32 zero = 0;
	__u32 *active = bpf_map_lookup_elem(&active_slot, &zero);
	if (!active)
		goto unselected;
	__u32 slot = *active & (TL_SLOTS - 1);
	struct tl_settings *s = bpf_map_lookup_elem(&settings, &slot);
	if (!s || !s->table_len)
		goto unselected;
	if (!is_selected(&p, slot, s))
		goto unselected;
	if ((s->flags & TL_HAS_EXEMPT) && is_exempt(&p, slot)) {
		count(&misc_stats, TL_MISC_EXEMPT, bytes);
		return XDP_PASS;
	}

	struct tl_window *w = bpf_map_lookup_elem(&window, &zero);
	if (!w)
		goto unselected;
	__u64 n = window_count(w, s);

	/* n from last_n on takes the last entry, which settings hold: the last
	 * tier runs to infinity, and a saturated window needs no table lookup. */
	__u32 thr = s->last_thr, tier = s->last_tier;
	if (n < s->last_n) {
		__u64 idx = n >> (s->shift & TL_SHIFT_MASK);
		if (idx >= s->table_len)
			idx = s->table_len - 1;
		__u32 key = slot * TL_TABLE_MAX + (__u32)idx;
		struct tl_entry *e = bpf_map_lookup_elem(&tier_table, &key);
		if (!e)
			goto unselected;
		thr = e->thr;
		tier = e->tier;
	}

	/* TL_THR_NEVER never drops and TL_THR_ALWAYS always does, whatever the draw. */
	__u32 verdict = TL_PASS;
	if (thr != TL_THR_NEVER && s->mode != TL_MODE_OFF && (thr == TL_THR_ALWAYS || bpf_get_prandom_u32() < thr))
		verdict = s->mode == TL_MODE_ENFORCE ? TL_DROP : TL_WOULD_DROP;

	count(&stats, tier * TL_VERDICTS + verdict, bytes);

	if (p.frag == FRAG_FIRST) {
		struct tl_frag_key k = {};
		frag_key(&p, &k);
		__u32 v = verdict == TL_DROP ? TL_DROP : TL_PASS;
		bpf_map_update_elem(&frag_verdicts, &k, &v, BPF_ANY);
	}
	return verdict == TL_DROP ? XDP_DROP : XDP_PASS;

unselected:
	count(&misc_stats, TL_MISC_UNSELECTED, bytes);
	return XDP_PASS;
}
