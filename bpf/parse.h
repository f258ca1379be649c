/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Packet parsing, Ethernet to UDP or TCP: a header cursor and one function
 * per layer (each checks bounds, advances the cursor and returns the next
 * protocol or a PARSE_* error), the fragment kinds, the addresses, and the
 * header fields the entry point hands to tl_judge (pkt_pack, pkt_unpack).
 * The parser only classifies (parse_packet's PKT_*); the entry point passes
 * every malformed packet, and verdict.h judges fragments (DESIGN.md §2). */
#ifndef __TL_PARSE_H
#define __TL_PARSE_H

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"
#include "consts.h"
#include "types.h"

enum {
	PARSE_SHORT = -1,     /* truncated, not what we select, or too deep */
	PARSE_MALFORMED = -2, /* a length field disagrees: pkt.mal says which */
};

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

/* Protocols whose non-first fragments follow their first: the ones a first
 * fragment is walked to UDP or TCP through. */
static __always_inline int follows_first(__u8 proto)
{
	return proto == IPPROTO_UDP || proto == IPPROTO_TCP || proto == IPPROTO_AH;
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
 *       16..23 l4proto     24..31 frag (FRAG_*)
 *       32..39 syn         40..47 frag_proto
 *   a2:  0..31 frag_id     32..47 dport
 *       48..63 offset of the L4 payload from data (the cursor after UDP/TCP)
 *
 * The parser's own fields (frag_off, l4len, mal) stay behind: tl_judge
 * reads none of them. bpf's TestPackedFields judges frames whose every
 * field here decides a verdict or a counter. */
_Static_assert(sizeof(struct ethhdr) + TL_VLAN_MAX * sizeof(struct vlan_hdr) <= 0xff,
	       "the L3 offset must fit in a1's 8 bits");

static __always_inline void pkt_pack(const struct pkt *p, __u64 l3_off, __u64 payload_off, __u64 *a1, __u64 *a2)
{
	*a1 = l3_off | (__u64)(p->l3proto == ETH_P_IPV6) << 8 | (__u64)p->l4proto << 16 |
	      (__u64)p->frag << 24 | (__u64)p->syn << 32 | (__u64)p->frag_proto << 40;
	*a2 = p->frag_id | (__u64)p->dport << 32 | payload_off << 48;
}

/* Fills p from pkt_pack's a1 and a2 and the frame [data, end), and returns
 * the payload offset. The headers are not checked again here: each reader
 * checks p->l3 against p->end, as the verifier knows nothing of the offset. */
static __always_inline __u32 pkt_unpack(struct pkt *p, __u64 a1, __u64 a2, void *data, void *end)
{
	p->l3 = data + (a1 & 0xff);
	p->end = end;
	p->l3proto = (a1 >> 8) & 1 ? ETH_P_IPV6 : ETH_P_IP;
	p->l4proto = a1 >> 16;
	p->frag = a1 >> 24;
	p->syn = a1 >> 32;
	p->frag_proto = a1 >> 40;
	p->frag_id = (__u32)a2;
	p->dport = a2 >> 32;
	return a2 >> 48;
}

#endif /* __TL_PARSE_H */
