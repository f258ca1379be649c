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

/* Severity-aware shedding, per CPU: selected UDP packets by
 * [class * TL_VERDICTS + verdict], then enum tl_sev_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_SEV_STATS);
	__type(key, __u32);
	__type(value, struct tl_stat);
} severity_stats SEC(".maps");

/* Verdict (TL_PASS or TL_DROP) of recent first fragments, for their followers. */
/* Drop verdicts of recent first fragments, for their followers, with the
 * time they expire (TL_FRAG_TTL_MS after the first). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, TL_FRAG_ENTRIES);
	__type(key, struct tl_frag_key);
	__type(value, struct tl_frag_verdict);
} frag_verdicts SEC(".maps");

/* The count-min sketch of source groups: cell row * TL_SKETCH_COLS + column,
 * a u64 with the count in its low 32 bits and the window id above. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TL_SKETCH_ROWS * TL_SKETCH_COLS);
	__type(key, __u32);
	__type(value, __u64);
} source_sketch SEC(".maps");

/* Over-budget packets by verdict (pass in mode off), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_VERDICTS);
	__type(key, __u32);
	__type(value, struct tl_stat);
} source_stats SEC(".maps");

/* Source groups seen over budget, least recently over evicted first. Per
 * CPU, so that a flood's own packets write nothing the CPUs share: the
 * agent sums the packets and takes the latest window (bpf.TopSources). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, TL_SRC_TOP_ENTRIES);
	__type(key, struct tl_src_key);
	__type(value, struct tl_src_top);
} source_top SEC(".maps");
/* Per CPU: the run of over-budget packets of one group this CPU is in,
 * counted here and added to source_top when the run ends (source_top_add). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tl_src_run);
} source_run SEC(".maps");

/* Malformed frames by enum tl_malformed, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TL_MAL_MAX);
	__type(key, __u32);
	__type(value, struct tl_stat);
} malformed_stats SEC(".maps");

/* Interfaces (by ifindex) the program is attached to in generic (skb)
 * mode, where one frame can be a UDP GSO/GRO super-packet. The value is
 * unused. The agent writes it, and tl_skb_ifaces, after attaching. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TL_SKB_IFACES);
	__type(key, __u32);
	__type(value, __u8);
} skb_ifaces SEC(".maps");

/* Entries of skb_ifaces: 0 spares every packet the lookup. A global, so
 * that the selected path reads it with one load. */
volatile __u32 tl_skb_ifaces;

/* Cost attribution, for benchmarks only (bpf BenchmarkStages). Built with
 * -DTL_BENCH_STAGES (the limiterStages object, gen.go), a program loaded
 * with tl_bench_stage = N returns XDP_DROP at TL_STAGE(N), so that the
 * cost of a path can be split by stage (enum tl_stage), each measured
 * beside a bare program. The limiter itself is built without it, and
 * TL_STAGE is nothing there. */
#ifdef TL_BENCH_STAGES
volatile const __u32 tl_bench_stage = 0;
#define TL_STAGE(n)                                  \
	do {                                         \
		if (tl_bench_stage == (n))           \
			return XDP_DROP;             \
	} while (0)
#else
#define TL_STAGE(n) do { } while (0)
#endif

enum {
	PARSE_SHORT = -1,     /* truncated, not what we select, or too deep */
	PARSE_MALFORMED = -2, /* a length field disagrees: pkt.mal says which */
};
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
	void *l3;      /* the IPv4 or IPv6 header; readers check it against end */
	void *end;     /* data_end */
	__u32 frag_id; /* IP identification, for fragments */
	__u16 l3proto; /* ETH_P_IP or ETH_P_IPV6 */
	__u16 dport;   /* host order */
	__u8 l4proto;
	__u8 frag; /* FRAG_* */
	__u8 syn;  /* TCP SYN without ACK */
	__u8 mal;  /* enum tl_malformed, when a parser returns PARSE_MALFORMED */
	__u8 frag_proto; /* protocol as the fragment declares it (frag key) */
	__u16 frag_off;  /* fragment offset, in 8-byte units */
	__u32 l4len;     /* bytes from the cursor to the IP-declared end */
};

/* A byte-swapped 16-bit length, with a mask the verifier sees: Linux 6.1's
 * verifier takes the result of a swap as unbounded, and clang drops a plain
 * mask it knows to be redundant, so the value goes through an empty asm. */
static __always_inline __u32 bounded16(__u32 v)
{
	asm volatile("" : "+r"(v));
	return v & 0xffff;
}

static __always_inline int malformed(struct pkt *p, __u8 reason)
{
	p->mal = reason;
	return PARSE_MALFORMED;
}

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

/* IPv4 with IHL validated and options skipped. Returns the L4 protocol;
 * PARSE_SHORT when truncated or not IPv4 (version, IHL < 5); PARSE_MALFORMED
 * when the total length is below IHL * 4 or past the frame, which the
 * kernel discards (ip_rcv_core). */
static __always_inline int parse_ipv4(struct cursor *c, struct pkt *p)
{
	struct iphdr *ip = c->pos;
	if ((void *)(ip + 1) > c->end)
		return PARSE_SHORT;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_SHORT;
	__u32 hlen = ip->ihl * 4;
	if (c->pos + hlen > c->end)
		return PARSE_SHORT;
	__u32 tot = bounded16(bpf_ntohs(ip->tot_len));
	if (tot < hlen || c->pos + tot > c->end)
		return malformed(p, TL_MAL_IPV4_LENGTH);
	c->pos += hlen;
	p->l4len = tot - hlen;

	__u16 off = bpf_ntohs(ip->frag_off);
	if (off & IP_OFFSET)
		p->frag = FRAG_NEXT;
	else if (off & IP_MF)
		p->frag = FRAG_FIRST;
	p->frag_off = off & IP_OFFSET;
	p->frag_proto = ip->protocol;
	p->frag_id = bpf_ntohs(ip->id);
	p->l3 = ip;
	p->end = c->end;
	p->l3proto = ETH_P_IP;
	return ip->protocol;
}

/* The Authentication Header (RFC 4302), after IPv4 or inside the IPv6
 * chain: its length counts 4-byte words, minus 2. Returns its next header,
 * PARSE_SHORT when truncated, PARSE_MALFORMED when it runs past the IP
 * payload. */
static __always_inline int parse_ah(struct cursor *c, struct pkt *p, __u8 reason)
{
	struct ip_auth_hdr *ah = c->pos;
	if ((void *)(ah + 1) > c->end)
		return PARSE_SHORT;
	__u32 len = ((__u32)ah->hdrlen + 2) * 4;
	if (len > p->l4len)
		return malformed(p, reason);
	if (c->pos + len > c->end)
		return PARSE_SHORT;
	c->pos += len;
	p->l4len -= len;
	return ah->nexthdr;
}

/* The IPv6 next-header values that this program walks before the L4
 * header: the ones the kernel walks before it delivers to UDP or TCP
 * (RFC 8200 §4; IANA "IPv6 Extension Header Types"). hop-by-hop (0),
 * routing (43), destination options (60) and fragment (44) as RFC 8200
 * defines them, and the Authentication Header (51). Every other value ends
 * the walk and the packet passes uncounted, because no UDP or TCP header a
 * socket would receive can be seen behind it: ESP (50, encrypted),
 * Mobility (135, RFC 6275: the last header, its payload proto is 59), HIP
 * (139, RFC 7401: likewise), Shim6 (140) and the experimental 253 and 254,
 * which the kernel does not parse either, and No Next Header (59). */
static __always_inline int ipv6_is_ext(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS ||
	       nh == IPPROTO_FRAGMENT || nh == IPPROTO_AH;
}

/* IPv6 and up to TL_IPV6_EXT_MAX extension headers (ipv6_is_ext). Returns
 * the upper-layer protocol; PARSE_SHORT when truncated or the chain is
 * longer than we walk; PARSE_MALFORMED when the payload length runs past
 * the frame or a header runs past the payload length. Stops at a non-first
 * fragment, whose payload holds no header. */
static __always_inline int parse_ipv6(struct cursor *c, struct pkt *p)
{
	struct ipv6hdr *ip6 = c->pos;
	if ((void *)(ip6 + 1) > c->end)
		return PARSE_SHORT;
	if (ip6->version != 6)
		return PARSE_SHORT;
	c->pos = ip6 + 1;
	p->l3 = ip6;
	p->end = c->end;
	p->l3proto = ETH_P_IPV6;
	p->l4len = bounded16(bpf_ntohs(ip6->payload_len));
	if (c->pos + p->l4len > c->end)
		return malformed(p, TL_MAL_IPV6_LENGTH);
	__u8 nh = ip6->nexthdr;

	for (int i = 0; i < TL_IPV6_EXT_MAX; i++) {
		if (nh == IPPROTO_FRAGMENT) {
			struct frag_hdr *fh = c->pos;
			if ((void *)(fh + 1) > c->end)
				return PARSE_SHORT;
			if (sizeof(*fh) > p->l4len)
				return malformed(p, TL_MAL_IPV6_LENGTH);
			c->pos = fh + 1;
			p->l4len -= sizeof(*fh);
			nh = fh->nexthdr;
			__u16 off = bpf_ntohs(fh->frag_off);
			p->frag_id = bpf_ntohl(fh->identification);
			p->frag_proto = nh;
			p->frag_off = off >> 3;
			if (off & IP6_OFFSET) {
				p->frag = FRAG_NEXT;
				return nh;
			}
			if (off & IP6_MF)
				p->frag = FRAG_FIRST;
		} else if (nh == IPPROTO_AH) {
			int r = parse_ah(c, p, TL_MAL_IPV6_LENGTH);
			if (r < 0)
				return r;
			nh = r;
		} else if (ipv6_is_ext(nh)) {
			struct ipv6_opt_hdr *oh = c->pos;
			if ((void *)(oh + 1) > c->end)
				return PARSE_SHORT;
			__u32 len = ((__u32)oh->hdrlen + 1) * 8;
			if (len > p->l4len)
				return malformed(p, TL_MAL_IPV6_LENGTH);
			nh = oh->nexthdr;
			if (c->pos + len > c->end)
				return PARSE_SHORT;
			c->pos += len;
			p->l4len -= len;
		} else {
			return nh;
		}
	}
	return ipv6_is_ext(nh) ? PARSE_SHORT : nh;
}

/* A first fragment whose L4 header does not fit in its IP payload
 * (RFC 1858 §3); a whole packet in that state is malformed. */
static __always_inline int short_l4(struct pkt *p, __u8 reason)
{
	return malformed(p, p->frag == FRAG_FIRST ? TL_MAL_TINY_FRAGMENT : reason);
}

/* UDP: returns 0 with the destination port; PARSE_SHORT when truncated;
 * PARSE_MALFORMED when the IP payload cannot hold the header or the UDP
 * length is below 8 or, except in a first fragment (where it is the whole
 * datagram's), past the IP payload: the kernel discards those (udp_rcv). */
static __always_inline int parse_udp(struct cursor *c, struct pkt *p)
{
	struct udphdr *udp = c->pos;
	if (sizeof(*udp) > p->l4len)
		return short_l4(p, TL_MAL_UDP_LENGTH);
	if ((void *)(udp + 1) > c->end)
		return PARSE_SHORT;
	__u32 ulen = bounded16(bpf_ntohs(udp->len));
	if (ulen < sizeof(*udp) || (ulen > p->l4len && p->frag != FRAG_FIRST))
		return malformed(p, TL_MAL_UDP_LENGTH);
	c->pos = udp + 1;
	p->dport = bpf_ntohs(udp->dest);
	return 0;
}

/* TCP: returns 0 with the destination port and the SYN-without-ACK bit;
 * PARSE_SHORT when the header (options included) is truncated;
 * PARSE_MALFORMED when the data offset is below 5 or the header runs past
 * the IP payload (the kernel discards it, tcp_v4_rcv). */
static __always_inline int parse_tcp(struct cursor *c, struct pkt *p)
{
	struct tcphdr *tcp = c->pos;
	if (sizeof(*tcp) > p->l4len)
		return short_l4(p, TL_MAL_TCP_LENGTH);
	if ((void *)(tcp + 1) > c->end)
		return PARSE_SHORT;
	if (tcp->doff < 5)
		return malformed(p, TL_MAL_TCP_LENGTH);
	if (tcp->doff * 4 > p->l4len)
		return short_l4(p, TL_MAL_TCP_LENGTH);
	if (c->pos + tcp->doff * 4 > c->end)
		return PARSE_SHORT;
	c->pos += tcp->doff * 4;
	p->dport = bpf_ntohs(tcp->dest);
	p->syn = tcp->syn && !tcp->ack;
	return 0;
}

/* The furthest a UDP payload may start for parse_pri to read its <PRI>. */
#define TL_PRI_OFF_MAX 0x3fff

/* parse_pri's result for a packet that severity does not judge. */
#define TL_SEV_NONE (-2)

/* The syslog <PRI> at the start of a UDP payload (RFC 5424 §6.2.1, RFC 3164
 * §4.1.1): "<", 1 to 3 digits without a leading zero, a value 0..191, ">".
 * Returns the severity (PRI mod 8), or -1 when it is missing, malformed or
 * out of range, or the payload ends first. Reads at most 5 bytes. */
static __always_inline int parse_pri(const struct cursor *c)
{
	const __u8 *b = c->pos;
	__u32 v = 0;

	if ((void *)(b + 3) > c->end || b[0] != '<')
		return -1;
#pragma unroll
	for (int i = 1; i <= 4; i++) {
		if ((void *)(b + i + 1) > c->end)
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

/* Writes the source (dst = 0) or destination address as 16 bytes, IPv4 as
 * IPv4-mapped IPv6 (RFC 4291 §2.5.5.2). */
static __always_inline void load_addr(const struct pkt *p, int dst, __u8 out[16])
{
	if (p->l3proto == ETH_P_IP) {
		const struct iphdr *ip = p->l3;
		if ((void *)(ip + 1) > p->end) {
			__builtin_memset(out, 0, 16);
			return;
		}
		__u32 a = dst ? ip->daddr : ip->saddr;
		__builtin_memset(out, 0, 10);
		out[10] = 0xff;
		out[11] = 0xff;
		__builtin_memcpy(out + 12, &a, 4);
	} else {
		const struct ipv6hdr *ip6 = p->l3;
		if ((void *)(ip6 + 1) > p->end) {
			__builtin_memset(out, 0, 16);
			return;
		}
		__builtin_memcpy(out, dst ? &ip6->daddr : &ip6->saddr, 16);
	}
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
			.verdict = TL_DROP,
		};
		bpf_map_update_elem(&frag_verdicts, &k, &v, BPF_ANY);
	} else {
		bpf_map_delete_elem(&frag_verdicts, &k);
	}
}

/* Protocols whose non-first fragments follow their first: the ones a first
 * fragment is walked to UDP or TCP through. */
static __always_inline int follows_first(__u8 proto)
{
	return proto == IPPROTO_UDP || proto == IPPROTO_TCP || proto == IPPROTO_AH;
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
	__u32 family = p->l3proto == ETH_P_IPV6 ? TL_LPM_TAG_IPV6 : 0;
	for (__u32 i = 0; i < TL_MAX_RULES; i++) {
		if (!(rules & (1U << i)))
			continue;
		if ((s->syn_rules & (1U << i)) && !p->syn)
			continue;
		k.tag = family | slot << TL_DEST_RULE_BITS | i;
		if (bpf_map_lookup_elem(&select_dests, &k))
			return 1;
	}
	return 0;
}

static __always_inline int is_exempt(const struct pkt *p, __u32 slot)
{
	struct tl_lpm_key k = { .prefixlen = TL_LPM_TAG_BITS + TL_LPM_ADDR_BITS, .tag = slot };
	if (p->l3proto == ETH_P_IPV6)
		k.tag |= TL_LPM_TAG_IPV6;
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

/* bpf_loop's state for overflow_sum. */
struct overflow_sum_ctx {
	__u64 id;
	__u64 sum;
};

static long overflow_sum_cpu(__u32 cpu, struct overflow_sum_ctx *x)
{
	struct tl_overflow *o = bpf_map_lookup_elem(&overflow, &cpu);
	if (!o)
		return 1;
	__u32 i = x->id & 1;
	if (o->window[i] == x->id)
		x->sum += o->packets[i];
	return 0;
}

/* The packets of window id that the first nr_cpus CPUs counted in the
 * overflow map. bpf_loop (Linux >= 5.17), so that the verifier checks the
 * per-CPU step once instead of walking up to TL_MAX_CPUS iterations for
 * every state that reaches it. */
static __always_inline __u64 overflow_sum(__u64 id, __u32 nr_cpus)
{
	struct overflow_sum_ctx x = { .id = id };
	bpf_loop(nr_cpus < TL_MAX_CPUS ? nr_cpus : TL_MAX_CPUS, overflow_sum_cpu, &x, 0);
	return x.sum;
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
		/* A packet of the old window may still add to or pay the debt
		 * after this: it then counts in the new window (one per other
		 * CPU at most, in practice). */
		__sync_lock_test_and_set(&w->debt, 0);
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
		n += overflow_sum(id, s->nr_cpus);
	return n;
}

/* Severity-aware shedding (DESIGN.md §7) of a UDP packet of class cls whose
 * tier says drop (1) or pass (0); returns the final drop. A protected packet
 * takes a drop verdict as a pass while the window's debt is under
 * protect_budget, and adds one to it; any other packet takes a pass verdict
 * as a drop while the debt is positive, and pays one off. Each side adds
 * first and undoes when it overshot, so with any number of CPUs the debt
 * that stays is in [0, protect_budget]: protection never gives the
 * collector more than protect_budget extra packets per window. The debt is
 * read as signed: an add and its undo may leave it at -1 for an instant. */
static __always_inline int severity_verdict(struct tl_window *w, const struct tl_settings *s, __u32 cls,
					    int drop, __u64 bytes)
{
	if (drop && cls == TL_SEV_PROTECTED) {
		if ((__s64)READ_ONCE(w->debt) >= (__s64)s->protect_budget)
			return drop;
		if ((__s64)__sync_fetch_and_add(&w->debt, 1) < (__s64)s->protect_budget) {
			count(&severity_stats, TL_SEV_PROTECTED_PASS, bytes);
			return 0;
		}
		__sync_fetch_and_sub(&w->debt, 1);
		return drop;
	}
	if (!drop && cls != TL_SEV_PROTECTED && (__s64)READ_ONCE(w->debt) > 0) {
		if ((__s64)__sync_fetch_and_sub(&w->debt, 1) > 0) {
			count(&severity_stats, TL_SEV_PAID_DROP, bytes);
			return 1;
		}
		__sync_fetch_and_add(&w->debt, 1);
	}
	return drop;
}

/* The verdict of a selected UDP datagram under a policy with a severity
 * block (DESIGN.md §7): sev is its <PRI>'s severity (parse_pri, -1 for
 * none), tier and thr its tier-table entry. Shed-first datagrams take the
 * threshold of shed_drops[tier]; then severity_verdict applies the drop
 * debt, and the class and verdict are counted in severity_stats. s and w
 * are the caller's settings and window. Returns TL_PASS, TL_DROP or
 * TL_WOULD_DROP. */
static __always_inline __u32 tl_severity_judge(const struct tl_settings *s, struct tl_window *w, int sev,
					       __u32 tier, __u32 thr, __u64 bytes)
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
	if (s->mode != TL_MODE_OFF) {
		int drop = thr != TL_THR_NEVER && (thr == TL_THR_ALWAYS || bpf_get_prandom_u32() < thr);
		if (severity_verdict(w, s, cls, drop, bytes))
			verdict = s->mode == TL_MODE_ENFORCE ? TL_DROP : TL_WOULD_DROP;
	}
	if (cls >= TL_SEV_CLASSES)
		cls = TL_SEV_NORMAL;
	count(&severity_stats, cls * TL_VERDICTS + verdict, bytes);
	return verdict;
}

/* A non-first fragment carries no L4 header: it is never counted, and takes
 * the verdict of its first fragment when that was dropped less than
 * TL_FRAG_TTL_MS ago (DESIGN.md §2). */
static __always_inline int follow_fragment(struct pkt *p, __u64 bytes)
{
	struct tl_frag_key k = {};
	frag_key(p, &k);
	struct tl_frag_verdict *v = bpf_map_lookup_elem(&frag_verdicts, &k);
	if (v && v->verdict == TL_DROP && (__s64)(v->expires_ns - bpf_ktime_get_ns()) > 0) {
		count(&misc_stats, TL_MISC_FRAG_DROP, bytes);
		return XDP_DROP;
	}
	count(&misc_stats, TL_MISC_FRAG_PASS, bytes);
	return XDP_PASS;
}

/* Per-source budgets (DESIGN.md §6).
 *
 * A packet's source group is its source address masked per family. The
 * group's count in the current window is estimated by a count-min sketch:
 * TL_SKETCH_ROWS rows of TL_SKETCH_COLS cells, row r placing the group by
 * source_col with its own seeds. tiers.SourceColumn and tiers.Sketch are
 * the same functions in Go. Each cell carries the window id it counts for, so the
 * sketch is never cleared: a cell of another window counts as 0 and is
 * reset by the first packet that touches it. */

/* The column of a group in one row: the multiply-shift hash (Dietzfelbinger
 * et al. 1997; Thorup 2015, "High speed hashing for integers and strings",
 * vector multiply-shift), strongly universal over the key (x_0..x_3,
 * family): (a_0 x_0 + a_1 x_1 + a_2 x_2 + a_3 x_3 + a_4 [IPv6] + b) mod 2^64,
 * top TL_SKETCH_COL_BITS bits, with 64-bit seeds a_i, b of the row and the
 * 32-bit address words x_i (IPv4: x_0 only). Pairwise independence per row
 * is what the count-min sketch's analysis needs; the products do not depend
 * on each other, so the rows cost a few cycles each. */
static __always_inline __u32 source_col(const struct tl_src_key *k, const __u64 *a)
{
	__u64 h = a[5] + a[0] * k->addr[0];
	if (k->family == 6)
		h += a[1] * k->addr[1] + a[2] * k->addr[2] + a[3] * k->addr[3] + a[4];
	return h >> (64 - TL_SKETCH_COL_BITS);
}

/* The packet's source group. The address words are loaded as they lie in
 * the header and masked with masks tiers.Compile encoded the same way. */
static __always_inline void source_group(const struct pkt *p, const struct tl_settings *s,
					 struct tl_src_key *k)
{
	if (p->l3proto == ETH_P_IP) {
		const struct iphdr *ip = p->l3;
		if ((void *)(ip + 1) > p->end)
			return;
		k->addr[0] = ip->saddr & s->src_mask4;
		k->family = 4;
		return;
	}
	const struct ipv6hdr *ip6 = p->l3;
	if ((void *)(ip6 + 1) > p->end)
		return;
	/* Word loads, as of iphdr's saddr: XDP does not enforce alignment. */
	const __u32 *a = (const __u32 *)&ip6->saddr;
#pragma unroll
	for (int i = 0; i < 4; i++)
		k->addr[i] = a[i] & s->src_mask6[i];
	k->family = 6;
}

/* The id of the window the packet will be counted in: tl_window.opened, or
 * one more when the window has expired and this packet (or a racing one)
 * is about to open the next. It applies window_count's rule, tick gate
 * included, so the two agree but for a packet at a window's very end that
 * a racing CPU moves into the next window between the two reads: it is
 * counted in the sketch under the old id (accepted: one packet's share of
 * a group's budget is charged to the window that just ended). opened is
 * bumped by the opener after start_ns, so a CPU may pair the new start_ns
 * with the old opened for a few ns: same consequence. */
static __always_inline __u64 source_window(struct tl_window *w, const struct tl_settings *s)
{
	__u64 id = READ_ONCE(w->opened);
	if (s->window_jiffies && bpf_jiffies64() - READ_ONCE(w->start_jiffies) < s->window_jiffies)
		return id;
	if ((__s64)(bpf_ktime_get_ns() - READ_ONCE(w->start_ns)) > (__s64)s->window_ns)
		return id + 1;
	return id;
}

/* Adds one to a cell for window wid (already shifted above the count),
 * whose value the caller just read as old, and returns the cell's count for
 * that window, this packet included.
 *
 * Accepted races: a cell of an old window is reset by compare-and-swap to
 * (wid, 1); a CPU that loses the swap adds to what the winner wrote. A CPU
 * that read a current cell and adds just after another CPU reset it for a
 * newer window (a window boundary) adds to the newer window: an
 * overestimate of one, which a count-min sketch allows anyway. A count of
 * 2^32 packets in one window would carry into the window id (not reachable
 * at line rate within tiers.MaxWindow per cell). */
static __always_inline __u32 sketch_add(__u64 *cell, __u64 old, __u64 wid)
{
	if ((old >> TL_CELL_COUNT_BITS) != (wid >> TL_CELL_COUNT_BITS) &&
	    __sync_bool_compare_and_swap(cell, old, wid | 1))
		return 1;
	__u64 v = __sync_fetch_and_add(cell, 1) + 1;
	if ((v >> TL_CELL_COUNT_BITS) != (wid >> TL_CELL_COUNT_BITS))
		return 1; /* a newer window's cell: nothing of ours in it */
	return (__u32)v;
}

/* Counts the packet in its group's cells for window id and returns whether
 * the group is over budget: whether the least of its cells (never below the
 * group's true count) exceeds the budget, this packet included.
 *
 * Accepted race: a packet is within budget when it is among the first
 * budget packets of any one row, and CPUs racing on one group can reach
 * the rows in different orders, so a group may get a few packets over its
 * budget per window: at most what other CPUs count while one packet is
 * between its first and last row (nanoseconds; an interrupt's length at
 * worst). A group alone in its cells never gets fewer than its budget:
 * each row admits exactly its first budget increments.
 *
 * A group already over budget in every one of its cells is judged by plain
 * reads and not added: its cells all exceed the budget already, so adding
 * changes no decision, for it or for any group that shares a cell. The
 * flood's own packets thus touch the sketch without atomics, and counts
 * stop just above the budget. tiers.Sketch.Count does the same. A stale
 * read only sees a lower count (or an older window, read as 0), which
 * sends the packet to the atomic path. */
static __always_inline int sketch_over(const struct tl_src_key *k, const struct tl_settings *s, __u64 id)
{
	__u64 wid = (__u64)(__u32)id << TL_CELL_COUNT_BITS;
	__u64 *cells[TL_SKETCH_ROWS];
	__u64 vals[TL_SKETCH_ROWS];
	__u32 est = 0xffffffff;
#pragma unroll
	for (__u32 r = 0; r < TL_SKETCH_ROWS; r++) {
		__u32 key = r * TL_SKETCH_COLS + source_col(k, &s->src_seeds[r * TL_SEED_WORDS]);
		__u64 *cell = bpf_map_lookup_elem(&source_sketch, &key);
		if (!cell)
			return 0; /* cannot happen: key < max_entries */
		cells[r] = cell;
		__u64 v = READ_ONCE(*cell);
		vals[r] = v;
		__u32 c = (v >> TL_CELL_COUNT_BITS) == (wid >> TL_CELL_COUNT_BITS) ? (__u32)v : 0;
		if (c < est)
			est = c;
	}
	if (est > s->src_budget)
		return 1;

	est = 0xffffffff;
#pragma unroll
	for (__u32 r = 0; r < TL_SKETCH_ROWS; r++) {
		__u32 c = sketch_add(cells[r], vals[r], wid);
		if (c < est)
			est = c;
	}
	return est > s->src_budget;
}

/* Adds packets over budget in window id to group k's entry in this CPU's
 * value of source_top: plain adds, no atomics (only this CPU writes it,
 * and XDP does not nest on a CPU). An entry another CPU made has this
 * CPU's value zeroed, so the first packets here count a window too.
 * Accepted race: two CPUs that miss at once both insert; the second insert
 * fails (BPF_NOEXIST) and its packets go uncounted here (the source_stats
 * count has them). */
static __always_inline void source_top_put(const struct tl_src_key *k, __u64 id, __u64 packets)
{
	struct tl_src_top *t = bpf_map_lookup_elem(&source_top, k);
	if (!t) {
		struct tl_src_top n = { .packets = packets, .last_window = id, .windows = 1 };
		bpf_map_update_elem(&source_top, k, &n, BPF_NOEXIST);
		return;
	}
	t->packets += packets;
	if (t->last_window != id) {
		t->last_window = id;
		t->windows++;
	}
}

static __always_inline int same_group(const struct tl_src_key *a, const struct tl_src_key *b)
{
	return a->addr[0] == b->addr[0] && a->addr[1] == b->addr[1] && a->addr[2] == b->addr[2] &&
	       a->addr[3] == b->addr[3] && a->family == b->family;
}

/* Remembers a group over budget in window id for tierlimit status --top.
 * A flood from one source is a run of its packets on each CPU: the run's
 * first packet goes to source_top (so the group is listed at once), the
 * rest are counted in this CPU's source_run, without the hash lookup, and
 * added to source_top when the CPU's run ends (another group over budget,
 * or a new window). bpf.TopSources adds the runs still open. */
static __always_inline void source_top_add(const struct tl_src_key *k, __u64 id)
{
	__u32 zero = 0;
	struct tl_src_run *r = bpf_map_lookup_elem(&source_run, &zero);
	if (!r) {
		source_top_put(k, id, 1);
		return;
	}
	if (r->window == id && r->key.family && same_group(&r->key, k)) {
		r->packets++;
		return;
	}
	if (r->packets)
		source_top_put(&r->key, r->window, r->packets);
	source_top_put(k, id, 1);
	r->key = *k;
	r->window = id;
	r->packets = 0;
}

/* Judges a selected packet against its group's budget. Returns -1 when it
 * is within budget (it goes on to the window and the tiers), or the XDP
 * action for a packet over budget: dropped in enforce mode, passed in
 * dry-run (would_drop) and off, counted in source_stats and never in the
 * window. A first fragment's verdict is remembered for its followers. */
static __always_inline int source_budget(const struct pkt *p, const struct tl_settings *s,
					 struct tl_window *w, __u64 bytes)
{
	struct tl_src_key k = {};
	source_group(p, s, &k);
	__u64 id = source_window(w, s);
	TL_STAGE(TL_STAGE_GROUP);
	int over = sketch_over(&k, s, id);
	TL_STAGE(TL_STAGE_SKETCH);
	if (!over)
		return -1;

	__u32 verdict = s->mode == TL_MODE_ENFORCE ? TL_DROP :
			s->mode == TL_MODE_DRY_RUN ? TL_WOULD_DROP : TL_PASS;
	count(&source_stats, verdict, bytes);
	source_top_add(&k, id);
	if (p->frag == FRAG_FIRST)
		remember_first(p, verdict);
	return verdict == TL_DROP ? XDP_DROP : XDP_PASS;
}

/* An RFC 1858 tiny fragment: dropped in enforce mode whatever its port (no
 * stack sends one; it hides the header the limiter judges), passed in
 * dry-run and off. Counted as malformed, never in the window. A first
 * fragment's verdict holds for its followers. */
static __always_inline int tiny_fragment(struct pkt *p, __u64 bytes)
{
	__u32 zero = 0;
	struct tl_settings *s = NULL;
	__u32 *active = bpf_map_lookup_elem(&active_slot, &zero);
	if (active) {
		__u32 slot = *active & (TL_SLOTS - 1);
		s = bpf_map_lookup_elem(&settings, &slot);
	}
	count(&malformed_stats, TL_MAL_TINY_FRAGMENT, bytes);
	__u32 verdict = s && s->table_len && s->mode == TL_MODE_ENFORCE ? TL_DROP : TL_PASS;
	if (p->frag == FRAG_FIRST)
		remember_first(p, verdict);
	return verdict == TL_DROP ? XDP_DROP : XDP_PASS;
}

/* Kernel-internal layouts, read with CO-RE (relocated against the running
 * kernel's BTF at load): only the fields used. */
struct xdp_buff {
	void *data_hard_start;
	__u32 frame_sz;
} __attribute__((preserve_access_index));

struct skb_shared_info {
	__u16 gso_size;
	__u16 gso_segs;
	unsigned int gso_type;
} __attribute__((preserve_access_index));

/* include/linux/skbuff.h, in an anonymous enum (so CO-RE cannot relocate
 * it), unchanged since Linux 4.18. SKB_GSO_UDP (UDP fragmentation offload)
 * carries one datagram and is not counted as several. */
#define SKB_GSO_UDP_L4 (1 << 17)

/* Linux >= 6.2. Weak: on an older kernel the loader leaves them out, and
 * udp_segments counts 1 (the agent refuses generic mode there). */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

/* SKB_DATA_ALIGN's cache line (SMP_CACHE_BYTES on x86-64 and arm64). */
#define TL_CACHE_BYTES 64

/* The datagrams a UDP frame carries: gso_segs of a GSO/GRO super-packet
 * (UDP_SEGMENT senders, UDP GRO) on an interface in generic mode, else 1.
 * Generic XDP builds its xdp_buff on the skb's head, with frame_sz reaching
 * the end of skb_shared_info (bpf_prog_run_generic_xdp), so the shared info
 * sits where xdp_get_shared_info_from_buff finds it. Native buffers carry
 * no GSO state and may hold anything there, hence the skb_ifaces check. */
static __always_inline __u32 udp_segments(struct xdp_md *ctx)
{
	__u32 ifindex = ctx->ingress_ifindex;
	if (!bpf_cast_to_kern_ctx || !bpf_rdonly_cast)
		return 1;
	if (!bpf_map_lookup_elem(&skb_ifaces, &ifindex))
		return 1;
	struct xdp_buff *xb = bpf_cast_to_kern_ctx(ctx);
	__u64 hard = (__u64)xb->data_hard_start;
	__u64 size = __builtin_preserve_type_info(*(struct skb_shared_info *)0, 1 /* BPF_TYPE_SIZE */);
	__u64 at = hard + xb->frame_sz - ((size + TL_CACHE_BYTES - 1) & ~(__u64)(TL_CACHE_BYTES - 1));
	struct skb_shared_info *si = bpf_rdonly_cast((void *)at,
		__builtin_btf_type_id(*(struct skb_shared_info *)0, 1 /* BPF_TYPE_ID_TARGET */));
	__u32 gso_type = si->gso_type;
	__u32 gso_size = si->gso_size;
	__u32 segs = si->gso_segs;
	if (!gso_size || !(gso_type & SKB_GSO_UDP_L4) || !segs)
		return 1;
	return segs;
}

/* What parse_packet found: how the program goes on. */
enum {
	PKT_L4 = 0,        /* UDP or TCP header parsed: judge it */
	PKT_UNSELECTED = 1, /* not IP, not UDP or TCP, truncated, too deep */
	PKT_MALFORMED = 2, /* pkt.mal says which length field */
	PKT_TINY = 3,      /* an RFC 1858 tiny fragment */
	PKT_FOLLOW = 4,    /* a non-first fragment that follows its first */
};

/* Every layer, Ethernet to UDP or TCP. Returns PKT_*. */
static __always_inline int parse_packet(struct cursor *c, struct pkt *p)
{
	int l4;

	switch (parse_eth(c)) {
	case ETH_P_IP:
		l4 = parse_ipv4(c, p);
		if (l4 == IPPROTO_AH && p->frag != FRAG_NEXT)
			l4 = parse_ah(c, p, TL_MAL_IPV4_LENGTH);
		break;
	case ETH_P_IPV6:
		l4 = parse_ipv6(c, p);
		break;
	default:
		return PKT_UNSELECTED;
	}
	if (l4 == PARSE_MALFORMED)
		return PKT_MALFORMED;
	if (p->frag == FRAG_NEXT && follows_first(p->frag_proto)) {
		/* RFC 1858 §4: a TCP fragment at offset 8 bytes can rewrite the flags of its first. */
		if (l4 == IPPROTO_TCP && p->frag_off == 1)
			return PKT_TINY;
		return PKT_FOLLOW;
	}
	if (l4 != IPPROTO_UDP && l4 != IPPROTO_TCP)
		return PKT_UNSELECTED;
	p->l4proto = l4;
	int r = l4 == IPPROTO_UDP ? parse_udp(c, p) : parse_tcp(c, p);
	if (r == PARSE_MALFORMED)
		return p->mal == TL_MAL_TINY_FRAGMENT ? PKT_TINY : PKT_MALFORMED;
	return r < 0 ? PKT_UNSELECTED : PKT_L4;
}

/* count() for a frame that is packets datagrams. */
static __always_inline void count_n(void *map, __u32 key, __u32 packets, __u64 bytes)
{
	struct tl_stat *st = bpf_map_lookup_elem(map, &key);
	if (st) {
		st->packets += packets;
		st->bytes += bytes;
	}
}

/* The judgement of a parsed UDP or TCP packet, from its header fields (see
 * tierlimit, which packs them): settings, selectors, exempt sources, source
 * budget, window, tier table and severity; counts it and returns the XDP
 * action.
 *
 * A global function, so the verifier checks it once, with its arguments
 * unknown, instead of once for every path through the parser that reaches
 * it: VLAN depths, IPv4 options, IPv6 extension-header chains and fragment
 * kinds each leave different packet offsets, and every one of them would
 * otherwise be explored through the selectors' loop and everything after
 * (TestVerifierComplexity). The headers are found again from ctx, by
 * offset, and bounds checked. */
__noinline int tl_judge(struct xdp_md *ctx, __u64 a1, __u64 a2, __u64 a3)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 bytes = data_end - data;
	struct pkt p = {};
	__u32 l3_off = a1 & 0xff;
	p.l3proto = (a1 >> 8) & 1 ? ETH_P_IPV6 : ETH_P_IP;
	p.l4proto = a1 >> 16;
	p.frag = a1 >> 24;
	p.syn = a1 >> 32;
	p.frag_proto = a1 >> 40;
	p.frag_id = (__u32)a2;
	p.dport = a2 >> 32;
	p.frag_off = a2 >> 48;
	p.l4len = (__u32)a3;
	/* The payload's offset, bounded so that the verifier can range-check
	 * a pointer at it (TL_PRI_OFF_MAX: a payload further in is read as
	 * having no <PRI>). */
	__u32 pri_off = (a3 >> 32) & 0xffff;
	/* The parser checked the headers; each reader checks again against
	 * end, as the verifier knows nothing of these offsets here. */
	p.l3 = data + l3_off;
	p.end = data_end;
	struct cursor c = { .pos = data + (pri_off & TL_PRI_OFF_MAX), .end = data_end };
	TL_STAGE(TL_STAGE_JUDGE);

	__u32 zero = 0;
	__u32 *active = bpf_map_lookup_elem(&active_slot, &zero);
	if (!active)
		goto unselected;
	__u32 slot = *active & (TL_SLOTS - 1);
	struct tl_settings *s = bpf_map_lookup_elem(&settings, &slot);
	if (!s || !s->table_len)
		goto unselected;
	/* Read the <PRI> now, so that the cursor is dead from here on: the
	 * verifier then need not tell apart the parser's paths below. */
	int sev = TL_SEV_NONE;
	if (s->sev_on && p.l4proto == IPPROTO_UDP)
		sev = pri_off <= TL_PRI_OFF_MAX ? parse_pri(&c) : -1;
	if (!is_selected(&p, slot, s))
		goto unselected;
	if ((s->flags & TL_HAS_EXEMPT) && is_exempt(&p, slot)) {
		count(&misc_stats, TL_MISC_EXEMPT, bytes);
		if (p.frag == FRAG_FIRST)
			remember_first(&p, TL_PASS);
		return XDP_PASS;
	}

	TL_STAGE(TL_STAGE_POLICY);

	struct tl_window *w = bpf_map_lookup_elem(&window, &zero);
	if (!w)
		goto unselected;
	if (s->src_budget) {
		int act = source_budget(&p, s, w, bytes);
		if (act >= 0)
			return act;
	}
	__u64 n = window_count(w, s);
	TL_STAGE(TL_STAGE_WINDOW);

	/* A super-packet counts as the datagrams it carries: the rest of them
	 * join the window right behind the first, and the whole skb takes the
	 * verdict of its last datagram's n. */
	__u32 segs = 1;
	if (tl_skb_ifaces && p.l4proto == IPPROTO_UDP) {
		segs = udp_segments(ctx);
		if (segs > 1)
			n = __sync_fetch_and_add(&w->count, segs - 1) + segs;
	}

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
	if (sev != TL_SEV_NONE) {
		verdict = tl_severity_judge(s, w, sev, tier, thr, bytes);
	} else if (s->mode != TL_MODE_OFF &&
		   thr != TL_THR_NEVER && (thr == TL_THR_ALWAYS || bpf_get_prandom_u32() < thr)) {
		verdict = s->mode == TL_MODE_ENFORCE ? TL_DROP : TL_WOULD_DROP;
	}

	count_n(&stats, tier * TL_VERDICTS + verdict, segs, bytes);

	if (p.frag == FRAG_FIRST)
		remember_first(&p, verdict);
	return verdict == TL_DROP ? XDP_DROP : XDP_PASS;

unselected:
	if (p.frag == FRAG_FIRST && follows_first(p.frag_proto))
		remember_first(&p, TL_PASS);
	count(&misc_stats, TL_MISC_UNSELECTED, bytes);
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

	TL_STAGE(TL_STAGE_ENTRY);
	switch (parse_packet(&c, &p)) {
	case PKT_L4:
		TL_STAGE(TL_STAGE_PARSED);
		break;
	case PKT_FOLLOW:
		return follow_fragment(&p, bytes);
	case PKT_TINY:
		return tiny_fragment(&p, bytes);
	case PKT_MALFORMED:
		count(&malformed_stats, p.mal < TL_MAL_MAX ? p.mal : TL_MAL_IPV4_LENGTH, bytes);
		return XDP_PASS;
	default:
		if (p.frag == FRAG_FIRST && follows_first(p.frag_proto))
			remember_first(&p, TL_PASS);
		count(&misc_stats, TL_MISC_UNSELECTED, bytes);
		return XDP_PASS;
	}
	/* Only scalars cross into tl_judge: offsets and header fields. */
	__u64 a1 = (__u64)((void *)p.l3 - data) | (__u64)(p.l3proto == ETH_P_IPV6) << 8 |
		   (__u64)p.l4proto << 16 | (__u64)p.frag << 24 | (__u64)p.syn << 32 |
		   (__u64)p.frag_proto << 40;
	__u64 a2 = p.frag_id | (__u64)p.dport << 32 | (__u64)p.frag_off << 48;
	__u64 a3 = p.l4len | (__u64)(c.pos - data) << 32;
	return tl_judge(ctx, a1, a2, a3);
}
