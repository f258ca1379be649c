/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Packet parsing, Ethernet to UDP or TCP (parse_ip.h up to the L4 header;
 * here UDP, TCP and parse_packet): a header cursor and one function
 * per layer (each checks bounds, advances the cursor and returns the next
 * protocol or a PARSE_* error), the fragment kinds, the addresses, and the
 * header fields the entry point hands to tl_judge (pkt_pack, pkt_unpack).
 * The parser only classifies (parse_packet's PKT_*); the entry point passes
 * every malformed packet, and verdict.h judges fragments (docs/design.md §2). */
#ifndef __TL_PARSE_H
#define __TL_PARSE_H

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"
#include "consts.h"
#include "types.h"
#include "parse_ip.h"

/* A first fragment whose L4 header does not fit in its IP payload
 * (RFC 1858 §3); a whole packet in that state is malformed. */
static __always_inline int short_l4(struct pkt *p, __u8 reason)
{
	return malformed(p, p->frag == FRAG_FIRST ? TL_MAL_TINY_FRAGMENT : reason);
}

/* UDP: returns 0 with the destination port; PARSE_SHORT when truncated;
 * PARSE_MALFORMED when the IP payload cannot hold the header or the UDP
 * length is below 8 (an IPv6 length of 0 is the rest of the payload) or, except in a first fragment (where it is the whole
 * datagram's), past the IP payload: the kernel discards those (udp_rcv). */
static __always_inline int parse_udp(struct pcur *c, struct pkt *p)
{
	if (sizeof(struct udphdr) > p->l4len)
		return short_l4(p, TL_MAL_UDP_LENGTH);
	struct udphdr *udp = pc_at(c, sizeof(*udp));
	if (!udp)
		return PARSE_SHORT;
	__u32 ulen = bounded16(bpf_ntohs(udp->len));
	/* __udp6_lib_rcv reads an IPv6 UDP length of 0 as the rest of the
	 * packet (a jumbogram's); udp_rcv (IPv4) discards it. */
	if (ulen == 0 && p->l3proto == ETH_P_IPV6)
		ulen = p->l4len;
	if (ulen < sizeof(*udp) || (ulen > p->l4len && p->frag != FRAG_FIRST))
		return malformed(p, TL_MAL_UDP_LENGTH);
	c->off += sizeof(*udp);
	p->plen = ulen - sizeof(*udp);
	p->dport = bpf_ntohs(udp->dest);
	return 0;
}

/* TCP: returns 0 with the destination port and the connection-attempt bit
 * (SYN without ACK, RST or FIN: a listener discards a SYN with RST or FIN,
 * tcp_rcv_state_process); PARSE_SHORT when the header (options included)
 * is truncated, or the frame went to a broadcast or multicast MAC, which
 * TCP discards (tcp_v4_rcv, tcp_v6_rcv: not PACKET_HOST); PARSE_MALFORMED
 * when the data offset is below 5 or the header runs past the IP payload
 * (the kernel discards it, tcp_v4_rcv). */
static __always_inline int parse_tcp(struct pcur *c, struct pkt *p)
{
	if (p->l2group && p->frag != FRAG_FIRST)
		return PARSE_SHORT;
	if (sizeof(struct tcphdr) > p->l4len)
		return short_l4(p, TL_MAL_TCP_LENGTH);
	struct tcphdr *tcp = pc_at(c, sizeof(*tcp));
	if (!tcp)
		return PARSE_SHORT;
	if (tcp->doff < 5)
		return malformed(p, TL_MAL_TCP_LENGTH);
	__u32 doff = tcp->doff * 4;
	if (doff > p->l4len)
		return short_l4(p, TL_MAL_TCP_LENGTH);
	if (c->off + doff > c->len)
		return PARSE_SHORT;
	c->off += doff;
	p->plen = p->l4len - doff;
	p->dport = bpf_ntohs(tcp->dest);
	p->syn = tcp->syn && !tcp->ack && !tcp->rst && !tcp->fin;
	return 0;
}

/* Protocols whose non-first fragments follow their first: the ones a first
 * fragment is walked to UDP or TCP through, and in IPv6 the destination
 * options and routing headers a fragment header may name before them
 * (parse_frag6 keys the fragment by the header it names). */
static __always_inline int follows_first(const struct pkt *p)
{
	__u8 proto = p->frag_proto;
	if (proto == IPPROTO_UDP || proto == IPPROTO_TCP || proto == IPPROTO_AH)
		return 1;
	return p->l3proto == ETH_P_IPV6 && (proto == IPPROTO_DSTOPTS || proto == IPPROTO_ROUTING);
}

/* What parse_packet found: how the program goes on. */
enum {
	PKT_L4 = 0,        /* UDP or TCP header parsed: judge it */
	PKT_UNSELECTED = 1, /* not IP, not UDP or TCP, truncated */
	PKT_MALFORMED = 2, /* pkt.mal says which length field or checksum */
	PKT_TINY = 3,      /* an RFC 1858 tiny fragment */
	PKT_FOLLOW = 4,    /* a non-first fragment that follows its first */
	PKT_DEEP = 5,      /* deliverable, port unknown: judged as selected (pkt.uncl) */
};

/* Every layer, Ethernet to UDP or TCP. Returns PKT_*. */
static __always_inline int parse_packet(struct pcur *c, struct pkt *p)
{
	int l4;

	switch (parse_eth(c, p)) {
	case ETH_P_IP:
		l4 = parse_ipv4(c, p);
		if (l4 == IPPROTO_AH && p->frag != FRAG_NEXT)
			l4 = parse_ah(c, p, TL_MAL_IPV4_LENGTH);
		break;
	case ETH_P_IPV6:
		l4 = parse_ipv6(c, p);
		break;
	case PARSE_DEEP:
		return PKT_DEEP;
	default:
		return PKT_UNSELECTED;
	}
	if (l4 == PARSE_MALFORMED)
		return PKT_MALFORMED;
	if (l4 == PARSE_DEEP)
		return PKT_DEEP;
	if (p->frag == FRAG_NEXT && follows_first(p)) {
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

/* pkt.plen as packed: a payload of 0xffff bytes or more (a BIG TCP or
 * jumbo one) is read from the frame by tl_judge. */
#define TL_PLEN_FRAME 0xffff

/* The furthest a UDP payload may start for parse_pri to read its <PRI>. */
#define TL_PRI_OFF_MAX 0x3fff

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

/* The fields of struct pkt that tl_judge reads, packed into the two scalars
 * that cross into it (a global function takes no pointer into the packet).
 * pkt_pack and pkt_unpack are one layout, bit 0 first:
 *
 *   a1:  0..7  offset of the L3 header from data (at most 14 + 4 * TL_VLAN_MAX)
 *        8     1 for IPv6, 0 for IPv4
 *        9..11 1 + enum tl_unclassified of an unclassified frame; 0: classified
 *       12     TL_A1_HOST_CHECK: the frame needs tl_host_discards' test
 *              (set by the entry point: host.h host_keeps)
 *       16..23 l4proto     24..31 frag (FRAG_*)
 *       32..39 syn         40..47 frag_proto
 *       48..63 plen, TL_PLEN_FRAME when 0xffff or more (take it from the frame)
 *   a2:  0..31 frag_id     32..47 dport
 *       48..63 offset of the L4 payload from data (the cursor after UDP/TCP)
 *
 * The parser's own fields (frag_off, l4len, mal) stay behind: tl_judge
 * reads none of them. bpf's TestPackedFields judges frames whose every
 * field here decides a verdict or a counter. */
_Static_assert(sizeof(struct ethhdr) + TL_VLAN_MAX * sizeof(struct vlan_hdr) <= 0xff,
	       "the L3 offset must fit in a1's 8 bits");
_Static_assert(TL_UNCL_MAX < 7, "an unclassified reason must fit in a1's 3 bits");

#define TL_A1_HOST_CHECK (1ULL << 12)

static __always_inline void pkt_pack(const struct pkt *p, int deep, __u64 payload_off, __u64 *a1, __u64 *a2)
{
	__u64 uncl = deep ? (__u64)(p->uncl + 1) & 7 : 0;
	__u64 plen = p->plen < TL_PLEN_FRAME ? p->plen : TL_PLEN_FRAME;
	*a1 = (p->l3off & 0xff) | (__u64)(p->l3proto == ETH_P_IPV6) << 8 | uncl << 9 | (__u64)p->l4proto << 16 |
	      (__u64)p->frag << 24 | (__u64)p->syn << 32 | (__u64)p->frag_proto << 40 | plen << 48;
	*a2 = p->frag_id | (__u64)p->dport << 32 | (payload_off & 0xffff) << 48;
}

/* parse_udp_fast's IPv4: no options, not a fragment, UDP, the header
 * checksum and every length as parse_ipv4 and parse_udp keep them (the IP
 * total length within the frame, the UDP length from 8 to the IP
 * payload's). len: the frame's bytes, at least its headers'. */
static __always_inline int udp4_fast(const struct iphdr *ip, __u64 len, __u64 *a1, __u64 *a2)
{
	const struct udphdr *udp = (const void *)(ip + 1);
	/* Version 4, IHL 5; no more fragments, offset 0 (DF may be set). */
	if (*(const __u8 *)ip != 0x45 || ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
		return 0;
	const __u32 *w = (const void *)ip;
	if (!csum_folds((__u64)w[0] + w[1] + w[2] + w[3] + w[4]))
		return 0;
	__u32 tot = bpf_ntohs(ip->tot_len), ulen = bpf_ntohs(udp->len);
	if (ulen < sizeof(*udp) || ulen + sizeof(*ip) > tot || sizeof(struct ethhdr) + tot > len)
		return 0;
	struct pkt p = {
		.l3off = sizeof(struct ethhdr),
		.l3proto = ETH_P_IP,
		.l4proto = IPPROTO_UDP,
		.frag = FRAG_NONE,
		.frag_proto = IPPROTO_UDP,
		.frag_id = bpf_ntohs(ip->id),
		.dport = bpf_ntohs(udp->dest),
		.plen = ulen - sizeof(*udp),
	};
	pkt_pack(&p, 0, sizeof(struct ethhdr) + sizeof(*ip) + sizeof(*udp), a1, a2);
	return 1;
}

/* parse_udp_fast's IPv6: UDP right after the header (no extension
 * header, so no fragment: frag_id and frag_proto 0, as parse_ipv6 leaves
 * them), the payload length within the frame, the UDP length from 8 to
 * the payload length (0, the rest of the payload, is left to tl_parse). */
static __always_inline int udp6_fast(const struct ipv6hdr *ip6, __u64 len, __u64 *a1, __u64 *a2)
{
	const struct udphdr *udp = (const void *)(ip6 + 1);
	if ((*(const __u8 *)ip6 >> 4) != 6 || ip6->nexthdr != IPPROTO_UDP)
		return 0;
	__u32 pl = bpf_ntohs(ip6->payload_len), ulen = bpf_ntohs(udp->len);
	if (ulen < sizeof(*udp) || ulen > pl || sizeof(struct ethhdr) + sizeof(*ip6) + pl > len)
		return 0;
	struct pkt p = {
		.l3off = sizeof(struct ethhdr),
		.l3proto = ETH_P_IPV6,
		.l4proto = IPPROTO_UDP,
		.frag = FRAG_NONE,
		.dport = bpf_ntohs(udp->dest),
		.plen = ulen - sizeof(*udp),
	};
	pkt_pack(&p, 0, sizeof(struct ethhdr) + sizeof(*ip6) + sizeof(*udp), a1, a2);
	return 1;
}

/* The frames most selected packets are: untagged Ethernet, IPv4 or IPv6,
 * UDP, in the plain form udp4_fast and udp6_fast accept. Packs one as
 * tl_parse would (pkt_pack: every field the same as parse_packet finds)
 * into *a1 and *a2 and returns 1; returns 0 for any other frame, which
 * tl_parse then parses whole. Inline in the entry point, at constant
 * offsets: it spares those frames the call of tl_parse and the parser's
 * spills. Each of its refusals reaches tl_parse's call with the same
 * state (no packet pointer nor value of its own is live there), so that
 * the verifier walks the parser once after it, not once per refusal. */
static __always_inline int parse_udp_fast(struct xdp_md *ctx, __u64 *a1, __u64 *a2)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	const struct ethhdr *eth = data;
	__u64 len = end - data;

	/* The shortest of the two: Ethernet, IPv4 and UDP headers. */
	if (data + sizeof(*eth) + sizeof(struct iphdr) + sizeof(struct udphdr) > end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return udp4_fast((const void *)(eth + 1), len, a1, a2);
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		const struct ipv6hdr *ip6 = (const void *)(eth + 1);
		if ((void *)ip6 + sizeof(*ip6) + sizeof(struct udphdr) > end)
			return 0;
		return udp6_fast(ip6, len, a1, a2);
	}
	return 0;
}

/* Fills p from pkt_pack's a1 and a2 and the frame [data, end), and returns
 * the payload offset. The headers are not checked again here: each reader
 * checks p->l3 against p->end, as the verifier knows nothing of the offset.
 * p->uncl is 1 + the reason of an unclassified frame, 0 for a classified
 * one; an unclassified frame of TL_UNCL_VLAN_DEPTH has no L3 header. */
static __always_inline __u32 pkt_unpack(struct pkt *p, __u64 a1, __u64 a2, void *data, void *end)
{
	p->l3 = data + (a1 & 0xff);
	p->end = end;
	p->l3proto = (a1 >> 8) & 1 ? ETH_P_IPV6 : ETH_P_IP;
	p->uncl = (a1 >> 9) & 7;
	p->l4proto = a1 >> 16;
	p->frag = a1 >> 24;
	p->syn = a1 >> 32;
	p->frag_proto = a1 >> 40;
	p->plen = a1 >> 48;
	p->frag_id = (__u32)a2;
	p->dport = a2 >> 32;
	return a2 >> 48;
}

#endif /* __TL_PARSE_H */
