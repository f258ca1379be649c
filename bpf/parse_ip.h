/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Packet parsing, Ethernet and IP: the parse state (struct pkt), and one
 * function per layer up to the L4 header: Ethernet and VLAN tags, IPv4
 * (checksum, lengths, fragments), the Authentication Header, IPv6 and its
 * extension headers (their options: ipv6_opts.h). The cursor it walks
 * with is cursor.h's; parse.h goes on with UDP and TCP. */
#ifndef __TL_PARSE_IP_H
#define __TL_PARSE_IP_H

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"
#include "consts.h"
#include "types.h"
#include "cursor.h"
#include "ipv6_opts.h"

enum {
	PARSE_SHORT = -1,     /* truncated, or not what we select */
	PARSE_MALFORMED = -2, /* a length field or checksum the kernel rejects: pkt.mal says which */
	PARSE_DEEP = -3,      /* deliverable, but the port cannot be told: pkt.uncl says why */
};

enum {
	FRAG_NONE = 0,
	FRAG_FIRST = 1, /* offset 0, more fragments follow */
	FRAG_NEXT = 2,  /* offset > 0: no L4 header */
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
	__u8 syn;  /* TCP SYN without ACK, RST or FIN */
	__u8 mal;  /* enum tl_malformed, when a parser returns PARSE_MALFORMED */
	__u8 frag_proto; /* protocol as the fragment declares it (frag key) */
	__u8 uncl;       /* enum tl_unclassified, when a parser returns PARSE_DEEP */
	__u16 frag_off;  /* fragment offset, in 8-byte units */
	__u32 l4len;     /* bytes from the cursor to the IP-declared end */
	__u32 l3off;     /* offset of the IP header from data */
	__u8 l2group;    /* the destination MAC is broadcast or multicast */
	/* The L4 payload's bytes (docs/design.md §2, count: bytes): the UDP
	 * length less its header (a first fragment's: the whole datagram's),
	 * or what follows the TCP header; tl_judge takes a super-packet's and
	 * TL_PLEN_FRAME's from the frame. wt is the packet's weight in the
	 * window: plen under count: bytes, else its datagrams (tl_judge). */
	__u32 plen;
	__u32 wt;
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

static __always_inline int deep(struct pkt *p, __u8 reason)
{
	p->uncl = reason;
	return PARSE_DEEP;
}

/* Ethernet and up to TL_VLAN_MAX VLAN tags. Returns the EtherType of the
 * payload in host order; PARSE_SHORT when truncated; PARSE_DEEP when more
 * tags follow, which Linux strips however many there are (priority tags,
 * VLAN 0, on any interface). */
static __always_inline int parse_eth(struct pcur *c, struct pkt *p)
{
	struct ethhdr *eth = pc_at(c, sizeof(*eth));
	if (!eth)
		return PARSE_SHORT;
	c->off = sizeof(*eth);
	p->l2group = eth->h_dest[0] & 1;
	__u16 proto = bpf_ntohs(eth->h_proto);

#pragma unroll
	for (int i = 0; i < TL_VLAN_MAX; i++) {
		if (proto != ETH_P_8021Q && proto != ETH_P_8021AD)
			return proto;
		struct vlan_hdr *vh = pc_at(c, sizeof(*vh));
		if (!vh)
			return PARSE_SHORT;
		c->off += sizeof(*vh);
		proto = bpf_ntohs(vh->h_vlan_encapsulated_proto);
	}
	if (proto == ETH_P_8021Q || proto == ETH_P_8021AD)
		return deep(p, TL_UNCL_VLAN_DEPTH);
	return proto;
}

/* Whether a sum of a header's 32-bit words folds to 0xffff: the header
 * checksum verifies (ip_fast_csum). */
static __always_inline int csum_folds(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

/* The IPv4 header checksum over hlen bytes (a multiple of 4, 20 to 60) at
 * ip, which the caller checked are in the frame: 1 when it verifies, as
 * ip_rcv_core requires. */
static __always_inline int ipv4_csum_ok(const struct pcur *c, __u32 hlen)
{
	__u32 *w = pc_at(c, 20);
	if (!w)
		return 0;
	__u64 sum = (__u64)w[0] + w[1] + w[2] + w[3] + w[4];
#pragma unroll
	for (__u32 i = 5; i < 15; i++) {
		if (i * 4 >= hlen)
			break;
		__u32 *o = (void *)w + i * 4;
		if ((void *)(o + 1) > c->end)
			return 0;
		sum += *o;
	}
	return csum_folds(sum);
}

/* FRAG_NEXT for an offset, else FRAG_FIRST when more fragments follow,
 * else FRAG_NONE; computed without a branch, so that the verifier holds
 * it as one value of a range, not as a constant per path that every later
 * test of it would make it track exactly. */
static __always_inline __u8 frag_kind(__u32 offset, __u32 more)
{
	__u32 next = offset & 1;
	return (next << 1) | (more & 1 & ~next);
}

/* segments.h: a TCP super-packet of several segments in generic mode. */
int tl_gso_tcp(struct xdp_md *ctx);

/* IPv4 with IHL validated and options skipped. Returns the L4 protocol;
 * PARSE_SHORT when truncated or not IPv4 (version, IHL < 5); PARSE_MALFORMED
 * when the header checksum fails, or the total length is below IHL * 4 or
 * past the frame (0 is the rest of a TCP super-packet): ip_rcv_core
 * discards those, in that order. */
static __always_inline int parse_ipv4(struct pcur *c, struct pkt *p)
{
	struct iphdr *ip = pc_at(c, sizeof(*ip));
	if (!ip)
		return PARSE_SHORT;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_SHORT;
	__u32 hlen = ip->ihl * 4;
	if (c->off + hlen > c->len)
		return PARSE_SHORT;
	if (!ipv4_csum_ok(c, hlen))
		return malformed(p, TL_MAL_IPV4_CHECKSUM);
	__u32 tot = bounded16(bpf_ntohs(ip->tot_len));
	/* iph_totlen: a total length of 0 on a TCP GSO skb (BIG TCP, over
	 * 64 KiB, Linux 6.3 and later) is the rest of the skb. */
	if (!tot && ip->protocol == IPPROTO_TCP && tl_gso_tcp(c->ctx))
		tot = c->len - c->off;
	if (tot < hlen || c->off + tot > c->len)
		return malformed(p, TL_MAL_IPV4_LENGTH);
	p->l3off = c->off;
	c->off += hlen;
	p->l4len = tot - hlen;

	__u16 off = bpf_ntohs(ip->frag_off);
	p->frag_off = off & IP_OFFSET;
	p->frag = frag_kind(p->frag_off != 0, (off & IP_MF) != 0);
	p->frag_proto = ip->protocol;
	p->frag_id = bpf_ntohs(ip->id);
	p->l3 = ip;
	p->end = c->end;
	p->l3proto = ETH_P_IP;
	return ip->protocol;
}

/* An extension header of len bytes does not fit in the IP payload: in a
 * first fragment (IPv6), the chain goes on in a later fragment, which the
 * kernel takes (RFC 7112 discards it only when the chain ends in the
 * first fragment but the L4 header does not fit) and delivers whole; in
 * any other packet it is malformed for reason. */
static __always_inline int ext_past_payload(struct pkt *p, __u8 reason)
{
	if (p->frag == FRAG_FIRST && p->l3proto == ETH_P_IPV6)
		return deep(p, TL_UNCL_FRAGMENT_CHAIN);
	return malformed(p, reason);
}

/* The Authentication Header (RFC 4302), after IPv4 or inside the IPv6
 * chain: its length counts 4-byte words, minus 2. Returns its next header,
 * PARSE_SHORT when truncated, PARSE_MALFORMED when it runs past the IP
 * payload (PARSE_DEEP in an IPv6 first fragment). */
static __always_inline int parse_ah(struct pcur *c, struct pkt *p, __u8 reason)
{
	/* The fixed part within the IP payload first: ah6_input and
	 * ah_input pull sizeof(struct ip_auth_hdr) of the payload the IP
	 * layer trimmed to its length, so bytes past it in the frame do not
	 * count (a frame can carry more than its IP length says). */
	if (p->l4len < sizeof(struct ip_auth_hdr))
		return ext_past_payload(p, reason);
	struct ip_auth_hdr *ah = pc_at(c, sizeof(*ah));
	if (!ah)
		return PARSE_SHORT;
	__u32 len = ((__u32)ah->hdrlen + 2) * 4;
	if (len > p->l4len)
		return ext_past_payload(p, reason);
	c->off += len;
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

/* One IPv6 fragment header: records the fragment and returns its next
 * header; PARSE_SHORT when truncated, or behind a payload length of 0 or
 * another fragment header, which the kernel discards. */
static __always_inline int parse_frag6(struct pcur *c, struct pkt *p)
{
	struct frag_hdr *fh = pc_at(c, sizeof(*fh));
	if (sizeof(*fh) > p->l4len)
		return ext_past_payload(p, TL_MAL_IPV6_LENGTH);
	if (!fh)
		return PARSE_SHORT;
	/* ipv6_frag_rcv: "Jumbo payload inhibits frag. header", an atomic
	 * one too. Read from the header again rather than kept from
	 * parse_ipv6: a flag live through the walk would double the paths
	 * the verifier tells apart. */
	const struct ipv6hdr *ip6 = p->l3;
	if ((void *)(ip6 + 1) > c->end || !ip6->payload_len)
		return PARSE_SHORT;
	/* A second fragment header: the first set IP6SKB_FRAGMENTED (an
	 * atomic one, or the reassembly of the rest), and ipv6_frag_rcv
	 * discards the packet at this one. frag_proto, the first's next
	 * header, is 0 only before any (a fragment header naming a
	 * hop-by-hop header is discarded at that header). */
	if (p->frag_proto)
		return PARSE_SHORT;
	c->off += sizeof(*fh);
	p->l4len -= sizeof(*fh);
	__u16 off = bpf_ntohs(fh->frag_off);
	p->frag_id = bpf_ntohl(fh->identification);
	p->frag_proto = fh->nexthdr;
	p->frag_off = off >> 3;
	p->frag = frag_kind(p->frag_off != 0, (off & IP6_MF) != 0);
	return fh->nexthdr;
}

/* IPv6 and up to TL_IPV6_EXT_MAX extension headers (ipv6_is_ext). Returns
 * the upper-layer protocol; PARSE_SHORT when truncated or when a
 * hop-by-hop header is not the first, or its options or a destination
 * options header's make Linux discard it (tl_ipv6_options), or a fragment header follows a payload length of 0;
 * PARSE_MALFORMED when the payload length runs past the frame or a header
 * runs past the payload length (a payload length of 0 with a hop-by-hop
 * header first is the rest of the frame); PARSE_DEEP when the chain is longer than we walk, or a
 * first fragment's chain goes on in the next fragment. Stops at a
 * non-first fragment, whose payload holds no header. */
static __always_inline int parse_ipv6(struct pcur *c, struct pkt *p)
{
	struct ipv6hdr *ip6 = pc_at(c, sizeof(*ip6));
	if (!ip6)
		return PARSE_SHORT;
	if (ip6->version != 6)
		return PARSE_SHORT;
	p->l3off = c->off;
	c->off += sizeof(*ip6);
	p->l3 = ip6;
	p->end = c->end;
	p->l3proto = ETH_P_IPV6;
	p->l4len = bounded16(bpf_ntohs(ip6->payload_len));
	__u8 nh = ip6->nexthdr;
	/* ip6_rcv_core's jumbogram path: a payload length of 0 with a
	 * hop-by-hop header first is neither checked nor trimmed, so the
	 * payload is the rest of the frame, trailer included, unless a
	 * Jumbo Payload option says otherwise (tl_ipv6_options). */
	if (c->off + p->l4len > c->len)
		return malformed(p, TL_MAL_IPV6_LENGTH);
	if (p->l4len == 0 && nh == IPPROTO_HOPOPTS)
		p->l4len = c->len - c->off;

	for (int i = 0; i < TL_IPV6_EXT_MAX; i++) {
		int r;
		/* Hop-by-hop options only right after the IPv6 header:
		 * ip6_rcv_core parses them there (ipv6_parse_hopopts), and
		 * later in the chain ip6_protocol_deliver_rcu finds no
		 * protocol for next header 0 and discards the packet. */
		if (nh == IPPROTO_HOPOPTS && i > 0)
			return PARSE_SHORT;
		if (nh == IPPROTO_FRAGMENT) {
			r = parse_frag6(c, p);
			if (r >= 0 && p->frag == FRAG_NEXT)
				return r;
		} else if (nh == IPPROTO_AH) {
			r = parse_ah(c, p, TL_MAL_IPV6_LENGTH);
		} else if (ipv6_is_ext(nh)) {
			struct ipv6_opt_hdr *oh = pc_at(c, sizeof(*oh));
			if (!oh)
				return p->l4len < sizeof(*oh) ? ext_past_payload(p, TL_MAL_IPV6_LENGTH) : PARSE_SHORT;
			__u32 len = ((__u32)oh->hdrlen + 1) * 8;
			if (len > p->l4len)
				return ext_past_payload(p, TL_MAL_IPV6_LENGTH);
			long l4len = tl_ipv6_options(c->ctx, p->l3off, c->off, len | (__u32)nh << 16, p->l4len);
			if (l4len < 0)
				return PARSE_SHORT;
			p->l4len = l4len;
			r = oh->nexthdr;
			c->off += len;
			p->l4len -= len;
		} else {
			return nh;
		}
		if (r < 0)
			return r;
		nh = r;
	}
	if (nh == IPPROTO_HOPOPTS)
		return PARSE_SHORT;
	return ipv6_is_ext(nh) ? deep(p, TL_UNCL_IPV6_CHAIN) : nh;
}

#endif /* __TL_PARSE_IP_H */
