/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* IPv6 hop-by-hop and destination options, read as the kernel reads them
 * (ip6_parse_tlv, ipv6_hop_jumbo), for parse_ip.h's walk of the
 * extension headers (parse_ipv6). */
#ifndef __TL_IPV6_OPTS_H
#define __TL_IPV6_OPTS_H

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "consts.h"
#include "calls.h"
#include "cursor.h"

/* A Jumbo Payload option at o, off bytes into its hop-by-hop header, as
 * ipv6_hop_jumbo (net/ipv6/exthdrs.c) reads it: returns its value when the
 * kernel accepts it (and trims the packet to it); -1 when it discards the
 * packet: an option length other than 4, an offset from the IPv6 header
 * not 2 modulo 4, a value up to 65535, a nonzero payload length (rest is
 * 0), or a value past the frame's rest after the IPv6 header. A frame
 * under 64 KiB + 40 bytes is always discarded: only a super-packet of
 * generic mode can pass. */
static __always_inline long hbh_jumbo(const struct pcur *o, __u32 off, __u32 rest)
{
	__u8 *b = pc_at(o, 6);
	if (!b || b[1] != 4 || (off & 3) != 2)
		return -1;
	__u32 plen = (__u32)b[2] << 24 | (__u32)b[3] << 16 | (__u32)b[4] << 8 | b[5];
	if (plen <= 0xffff || plen > rest)
		return -1;
	return plen;
}

/* The options of a hop-by-hop or destination options header of hlen
 * bytes at offset start from data, in the IPv6 packet at offset l3 whose
 * payload from start on is l4len bytes as the parser reads it, walked as
 * ip6_parse_tlv walks them (net/ipv6/exthdrs.c). hlen_nh is hlen, with
 * the header's own next-header number from bit 16 on (a global function
 * takes 5 arguments): for any other header (routing), it returns l4len,
 * which lets every extension header of the walk make the same call.
 *
 * Returns -1 when the kernel discards the packet for its options: an
 * option that runs past the header, a hop-by-hop Jumbo Payload option
 * that ipv6_hop_jumbo refuses (hbh_jumbo), or an option the kernel does
 * not know whose action bits (the type's top two) say discard; among
 * those it knows, only Jumbo Payload (hop-by-hop) and Home Address
 * (destination options, CONFIG_IPV6_MIP6) have bits other than 00, and a
 * Home Address option stays counted (an IPsec state may take it). Else
 * returns the payload's length: l4len, or the value of a Jumbo Payload
 * option that the kernel takes.
 *
 * It walks at most TL_HBH_OPTS_MAX options; past them, and for the rules
 * it does not read, the packet goes on, counted though the kernel
 * discards it (docs/design.md §2): more than 7 bytes of padding in a row,
 * PadN contents that are not zero, a Router Alert whose length is not 2
 * (these cost the verifier 61k more instructions on Linux 6.18, 11k of
 * them the Router Alert), CALIPSO and IOAM's own checks, and the
 * max_hbh_opts_cnt and max_dst_opts_cnt sysctls, which an administrator
 * sets.
 *
 * A global function, so that the verifier walks the options once, with
 * its arguments unknown, rather than once for every path to an options
 * header (TestVerifierComplexity). */
__noinline long tl_ipv6_options(struct xdp_md *ctx, __u32 l3, __u32 start, __u32 hlen_nh, __u32 l4len)
{
	TL_FN(TL_IPV6_OPTIONS);
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u64 flen = end - data;
	/* The subtraction stays 64-bit: the verifier refuses 32-bit
	 * arithmetic on pointers, which clang would make of rest's. */
	asm volatile("" : "+r"(flen));
	struct pcur o = { .data = data, .end = end, .len = flen, .off = l3 };
	__u32 hlen = hlen_nh & 0xffff, nh = hlen_nh >> 16, dst = nh == IPPROTO_DSTOPTS;
	__u32 off = 2, rest = 0;
	long plen = l4len;

	if (nh != IPPROTO_HOPOPTS && nh != IPPROTO_DSTOPTS)
		return plen;

	/* A payload length of 0 (ip6_rcv_core's jumbogram path): the
	 * payload is the rest of the frame, as hbh_jumbo reads it. */
	struct ipv6hdr *ip6 = pc_at(&o, sizeof(*ip6));
	if (!ip6)
		return plen;
	if (!ip6->payload_len)
		rest = flen - (l3 + sizeof(*ip6));

#pragma clang loop unroll(disable)
	for (int i = 0; i < TL_HBH_OPTS_MAX; i++) {
		if (off >= hlen)
			break;
		o.off = start + off;
		__u8 *b = pc_at(&o, 1);
		if (!b)
			break;
		__u8 type = b[0];
		if (type == IPV6_TLV_PAD1) {
			off++;
			continue;
		}
		if (hlen - off < 2)
			return -1;
		b = pc_at(&o, 2);
		if (!b)
			break;
		__u32 olen = (__u32)b[1] + 2;
		if (olen > hlen - off)
			return -1;
		if (type == IPV6_TLV_JUMBO && !dst) {
			plen = hbh_jumbo(&o, off, rest);
			if (plen < 0)
				return -1;
		} else if ((type & 0xc0) && !(dst && type == IPV6_TLV_HAO)) {
			return -1;
		}
		off += olen;
	}
	return plen;
}

#endif /* __TL_IPV6_OPTS_H */
