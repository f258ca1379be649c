/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* UDP GSO/GRO super-packets in generic (skb) mode: how many datagrams one
 * frame carries, read from the skb's shared info with CO-RE and kfuncs. */
#ifndef __TL_SEGMENTS_H
#define __TL_SEGMENTS_H

#include "maps.h"
#include "parse_ip.h"

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
#define SKB_GSO_TCPV4 (1 << 0)
#define SKB_GSO_TCPV6 (1 << 4)

/* Linux >= 6.2. Weak: on an older kernel the loader leaves them out, and
 * super_segments counts 1 (the agent refuses generic mode there). */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

/* SKB_DATA_ALIGN's cache line (SMP_CACHE_BYTES on x86-64 and arm64). */
#define TL_CACHE_BYTES 64

/* The segments of a super-packet whose gso_segs is 0: one from an
 * untrusted source (SKB_GSO_DODGY), a tap or virtio device's vnet header
 * (virtio_net_hdr_to_skb sets gso_segs 0), which the kernel counts when it
 * segments it as __udp_gso_segment and tcp_gso_segment do: the bytes after
 * the L4 header (at off from data, the UDP or TCP payload), in gso_size
 * pieces, rounded up; at least 1. Generic XDP hands the program the whole
 * skb, linear (docs/design.md §2). A global function, so that the
 * verifier checks it once: inlined, it cost +17k instructions. */
__noinline __u32 tl_dodgy_segments(struct xdp_md *ctx, __u32 gso_size, __u32 off)
{
	TL_FN(TL_DODGY_SEGMENTS);
	if (!ctx || !gso_size)
		return 1;
	__u64 len = ctx->data_end - ctx->data;
	__u64 segs = len > off ? (len - off + gso_size - 1) / gso_size : 1;
	return segs > 0xffff ? 0xffff : segs ? segs : 1;
}

/* The datagrams a UDP frame (tcp 0) carries, or the segments a TCP frame
 * (tcp 1) carries: gso_segs of a GSO/GRO super-packet (UDP_SEGMENT
 * senders, UDP GRO; TSO over a veth, TCP GRO) on an interface in generic
 * mode, or, when it is 0, tl_dodgy_segments with off the L4 payload's
 * offset (count 1, a constant); else 1. A TCP super-packet is never a SYN (tcp_gro_receive
 * flushes on SYN), so it counts only under count: packets.
 * Generic XDP builds its xdp_buff on the skb's head, with frame_sz reaching
 * the end of skb_shared_info (bpf_prog_run_generic_xdp), so the shared info
 * sits where xdp_get_shared_info_from_buff finds it. Native buffers carry
 * no GSO state and may hold anything there, hence the skb_ifaces check. */
static __always_inline __u32 super_segments(struct xdp_md *ctx, int tcp, __u32 off, const int count)
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
	__u32 want = tcp ? SKB_GSO_TCPV4 | SKB_GSO_TCPV6 : SKB_GSO_UDP_L4;
	if (!gso_size || !(gso_type & want))
		return 1;
	/* count 0 (tl_gso_tcp) asks only whether there are several: a vnet
	 * header marks a packet GSO only then (virtio_net_hdr_to_skb). */
	if (!segs)
		segs = count ? bounded16(tl_dodgy_segments(ctx, gso_size, off)) : 2;
	if (!segs)
		return 1;
	return segs;
}

/* Is the frame a TCP GSO/GRO super-packet of several segments (generic
 * mode)? Then ip_rcv_core reads an IPv4 total length of 0 as the rest of
 * the skb (iph_totlen: BIG TCP, over 64 KiB), and so does parse_ipv4. A
 * global function, declared in parse_ip.h, so that the verifier reads the
 * skb once, not on every path of the parser. */
__noinline int tl_gso_tcp(struct xdp_md *ctx)
{
	TL_FN(TL_GSO_TCP);
	if (!ctx)
		return 0;
	return super_segments(ctx, 1, 0, 0) > 1;
}

#endif /* __TL_SEGMENTS_H */
