/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Frames for this host (docs/design.md §2, "The kernel is the oracle"): a
 * selected frame that Linux certainly discards before any socket sees it
 * passes uncounted, as unselected. The rules are the kernel's receive
 * path, on the interfaces the agent describes (bpf.Limiter.SetIfaces):
 *   - another host's MAC: eth_type_trans (net/ethernet/eth.c) marks a
 *     unicast frame not to dev_addr PACKET_OTHERHOST, and ip_rcv_core and
 *     ip6_rcv_core discard it; unless another device takes it first (an
 *     rx_handler: a bridge, bond or team port, the lower device of
 *     macvlan, macvtap or VLAN children with MACs of their own) or takes
 *     it as its own (a bridge, a VLAN device), which the agent rules out
 *     before it sets TL_IF_MAC (agent/host.go macAcceptors); and, on such
 *     an interface, a VLAN tag with a nonzero VID (vlan_other_host);
 *   - IPv4 martians, whatever the sysctls but route_localnet
 *     (ip_route_input_slow, ip_route_input_mc and ip_mc_validate_source,
 *     net/ipv4/route.c), and TCP to a broadcast or multicast destination
 *     (tcp_v4_conn_request);
 *   - IPv6 martians of ip6_rcv_core (net/ipv6/ip6_input.c), and TCP to a
 *     multicast destination or a SYN from an IPv4-mapped source, which
 *     tcp_v6_conn_request discards.
 * An interface the agent did not describe is not checked: its frames are
 * counted as before, never passed uncounted. */
#ifndef __TL_HOST_H
#define __TL_HOST_H

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"
#include "consts.h"
#include "calls.h"
#include "types.h"
#include "parse.h"

/* The interfaces the agent described, each in slot ifindex % TL_IFACES:
 * its ifindex, and a word holding its MAC (the six bytes as a
 * little-endian load of a frame's destination reads them) and enum
 * tl_if_flag from bit TL_IF_FLAG_SHIFT; tl_if_count is how many. A slot
 * that holds another ifindex (two interfaces in one slot: the agent
 * describes the first) means no check. Globals, so that the selected path
 * reads them with plain loads, no map lookup and no loop. */
volatile __u32 tl_if_count;
volatile __u32 tl_if_index[TL_IFACES];
volatile __u64 tl_if_word[TL_IFACES];

_Static_assert((TL_IFACES & (TL_IFACES - 1)) == 0, "TL_IFACES must be a power of 2");

/* The word of interface ifindex, 0 when the agent did not describe it. */
static __always_inline __u64 iface_word(__u32 ifindex)
{
	__u32 i = ifindex & (TL_IFACES - 1);
	return tl_if_index[i] == ifindex ? tl_if_word[i] : 0;
}

/* A unicast destination MAC that is not the interface's: PACKET_OTHERHOST
 * (eth_type_trans). Broadcast and multicast frames are not. */
static __always_inline int other_host(const __u8 *eth, const void *end, __u64 word)
{
	if ((const void *)(eth + 6) > end || (eth[0] & 1))
		return 0;
	return *(const __u32 *)eth != (__u32)word || *(const __u16 *)(eth + 4) != (__u16)(word >> 32);
}

/* A VLAN tag with a nonzero VID among the first TL_VLAN_MAX, on an
 * interface with no VLAN device (TL_IF_MAC: no device of any kind sits on
 * it): vlan_do_receive finds no device for it, and
 * __netif_receive_skb_core marks the frame PACKET_OTHERHOST, which
 * ip_rcv_core and ip6_rcv_core discard. A VID 0 (priority) tag is
 * stripped and the next one looked at. Read from the frame, not from
 * the parser, so that no flag rides through the walk. In native mode a
 * NIC that strips VLAN tags (rx-vlan-offload) hands XDP the frame
 * without its tag: such a frame is counted though discarded. */
static __always_inline int vlan_other_host(const __u8 *data, const void *end)
{
	const __u8 *t = data + 12;
#pragma unroll
	for (int i = 0; i < TL_VLAN_MAX; i++) {
		if ((const void *)(t + 4) > end)
			return 0;
		__u16 proto = (__u16)t[0] << 8 | t[1];
		if (proto != ETH_P_8021Q && proto != ETH_P_8021AD)
			return 0;
		if ((t[2] & 0x0f) | t[3])
			return 1;
		t += 4;
	}
	return 0;
}

/* IPv4 addresses that routing discards whatever the sysctls, with
 * 127.0.0.0/8 when localnet (route_localnet off). In the kernel's order:
 * a multicast or limited-broadcast source always; to the limited
 * broadcast, or 0 to 0, anything else goes (brd_input); to multicast,
 * ip_mc_validate_source: a loopback source, and source 0.0.0.0 unless to
 * 224.0.0.0/24 (this path has no IGMP); else source or destination
 * 0.0.0.0, and a loopback one. TCP to a broadcast or multicast route
 * (tcp_v4_conn_request answers no SYN there, and no connection has such an
 * address) is discarded too. "Zeronet" is 0.0.0.0 alone since Linux 5.3
 * (ipv4_is_zeronet, include/linux/in.h: 0.0.0.0/8 is unicast space), and
 * class E (240/4) is routed: neither is a martian. */
static __always_inline int martian4(const struct iphdr *ip, int localnet, int tcp)
{
	__u32 s = bpf_ntohl(ip->saddr), d = bpf_ntohl(ip->daddr);
	if ((s >> 28) == 0xe || s == 0xffffffff)
		return 1;
	if (d == 0xffffffff || (s == 0 && d == 0))
		return tcp;
	int s_lo = localnet && (s >> 24) == 127;
	if ((d >> 28) == 0xe)
		return tcp || s_lo || (s == 0 && (d >> 8) != 0xe00000);
	return s == 0 || d == 0 || s_lo || (localnet && (d >> 24) == 127);
}

static __always_inline int loopback6(const __u32 *a)
{
	return (a[0] | a[1] | a[2]) == 0 && a[3] == bpf_htonl(1);
}

/* ip6_rcv_core on a device that is not loopback nor an L3 master: ::1 as
 * source or destination, a multicast destination of scope 0 (reserved) or
 * 1 (interface-local), a multicast source. And TCP: tcp_v6_conn_request
 * answers no SYN to a multicast destination (ipv6_unicast_destination) nor
 * from an IPv4-mapped source. */
static __always_inline int martian6(const struct ipv6hdr *ip6, int tcp, int syn)
{
	const __u32 *s = (const __u32 *)&ip6->saddr, *d = (const __u32 *)&ip6->daddr;
	const __u8 *d8 = (const __u8 *)d, s0 = *(const __u8 *)s;
	if (s0 == 0xff || (d8[0] == 0xff && (d8[1] & 0xf) <= 1))
		return 1;
	if (loopback6(s) || loopback6(d))
		return 1;
	if (!tcp)
		return 0;
	return d8[0] == 0xff || (syn && (s[0] | s[1]) == 0 && s[2] == bpf_htonl(0xffff));
}

/* The first-octet test of tl_host_discards: addresses that no martian
 * rule touches. IPv4: both first octets in 1-126 or 128-223; IPv6: both
 * first bytes neither 0x00 (::1, IPv4-mapped) nor 0xff (multicast). */
static __always_inline int plain_addrs(__u8 sf, __u8 df, int v6)
{
	return v6 ? (__u8)(sf - 1) < 0xfe && (__u8)(df - 1) < 0xfe
		  : (__u8)(sf - 1) < 223 && sf != 127 && (__u8)(df - 1) < 223 && df != 127;
}

/* Whether Linux certainly keeps this frame by the common case of each
 * rule, read inline (no call), on an untagged IPv4 or IPv6 frame (its L3
 * header at 14, as the parser finds it): the interface not described or
 * not checked; its MAC, or a broadcast or multicast one; addresses that
 * pass plain_addrs. 0 when a rule needs the rest of its test:
 * tl_host_discards answers then (a call). It decides only where
 * tl_host_discards would answer 0 by the same tests, so that the two agree
 * on every frame. It reads nothing of the parse (pkt_pack's a1), so that
 * the verifier checks it once, not once per parser path. */
static __always_inline int host_keeps(struct xdp_md *ctx)
{
	const __u8 *eth = (const void *)(long)ctx->data;
	const void *end = (const void *)(long)ctx->data_end;
	__u64 word = iface_word(ctx->ingress_ifindex);
	__u32 flags = word >> TL_IF_FLAG_SHIFT;
	if ((const void *)(eth + sizeof(struct ethhdr) + 40) > end)
		return 0;
	__u16 proto = (__u16)eth[12] << 8 | eth[13];
	if (proto != ETH_P_IP && proto != ETH_P_IPV6)
		return 0;
	if ((flags & TL_IF_MAC) && !(eth[0] & 1) &&
	    (*(const __u32 *)eth != (__u32)word || *(const __u16 *)(eth + 4) != (__u16)(word >> 32)))
		return 0;
	if (!(flags & TL_IF_MARTIAN))
		return 1;
	const __u8 *l3 = eth + sizeof(struct ethhdr);
	int v6 = proto == ETH_P_IPV6;
	return plain_addrs(l3[v6 ? 8 : 12], l3[v6 ? 24 : 16], v6);
}

/* Does Linux certainly discard this frame (the rules above)? a1
 * is the frame's pkt_pack word, read here field by field: the L3 offset,
 * the family, the unclassified reason, the L4 protocol and the SYN bit.
 * A global function, so that the verifier checks it once, with its
 * arguments unknown, rather than once for each of its outcomes through
 * the rest of tl_judge (TestVerifierComplexity: 87k instructions more
 * inline on 6.18, and no faster in BenchmarkHostChecks). */
__noinline int tl_host_discards(struct xdp_md *ctx, __u64 a1)
{
	TL_FN(TL_HOST_DISCARDS);
	if (!ctx)
		return 0;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u64 word = iface_word(ctx->ingress_ifindex);
	__u32 flags = word >> TL_IF_FLAG_SHIFT;
	if ((flags & TL_IF_MAC) && (other_host(data, end, word) || vlan_other_host(data, end)))
		return 1;
	if (!(flags & TL_IF_MARTIAN))
		return 0;
	const __u8 *l3 = data + (a1 & 0xff);
	int v6 = (a1 >> 8) & 1;
	/* The common case first: addresses that no rule touches. */
	__u32 so = v6 ? 8 : 12, dof = v6 ? 24 : 16;
	if (l3 + 40 <= (const __u8 *)end && plain_addrs(l3[so], l3[dof], v6))
		return 0;
	__u32 uncl = (a1 >> 9) & 7;
	if (uncl == 1 + TL_UNCL_VLAN_DEPTH)
		return 0;
	int tcp = ((a1 >> 16) & 0xff) == IPPROTO_TCP && !uncl;
	if (!v6) {
		const struct iphdr *ip = (const void *)l3;
		if ((const void *)(ip + 1) > end)
			return 0;
		return martian4(ip, flags & TL_IF_LOCALNET, tcp);
	}
	const struct ipv6hdr *ip6 = (const void *)l3;
	if ((const void *)(ip6 + 1) > end)
		return 0;
	return martian6(ip6, tcp, (a1 >> 32) & 0xff);
}

#endif /* __TL_HOST_H */
