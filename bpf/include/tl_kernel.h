/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The few kernel UAPI types and constants the tierlimit XDP program uses,
 * written out so that the build needs neither kernel headers nor vmlinux.h.
 * Layouts follow include/uapi/linux/{bpf,if_ether,ip,ipv6,udp,tcp}.h. */
#ifndef __TL_KERNEL_H
#define __TL_KERNEL_H

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef signed short __s16;
typedef unsigned int __u32;
typedef signed int __s32;
typedef unsigned long long __u64;
typedef signed long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

/* include/uapi/linux/bpf.h */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PROG_ARRAY = 3,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_LRU_PERCPU_HASH = 10,
	BPF_MAP_TYPE_LPM_TRIE = 11,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
	BPF_F_NO_PREALLOC = (1U << 0),
};

enum xdp_action {
	XDP_ABORTED = 0,
	XDP_DROP,
	XDP_PASS,
	XDP_TX,
	XDP_REDIRECT,
};

struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

/* include/uapi/linux/if_ether.h */
#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_8021Q 0x8100
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021AD 0x88A8

struct ethhdr {
	__u8 h_dest[ETH_ALEN];
	__u8 h_source[ETH_ALEN];
	__be16 h_proto;
} __attribute__((packed));

/* include/linux/if_vlan.h */
struct vlan_hdr {
	__be16 h_vlan_TCI;
	__be16 h_vlan_encapsulated_proto;
};

/* include/uapi/linux/in.h, include/uapi/linux/in6.h */
#define IPPROTO_HOPOPTS 0
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ROUTING 43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_DSTOPTS 60
#define IPPROTO_ESP 50
#define IPPROTO_AH 51

/* include/uapi/linux/ip.h (little-endian bitfield order) */
#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

struct iphdr {
	__u8 ihl : 4, version : 4;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__be32 saddr;
	__be32 daddr;
};

/* include/uapi/linux/ipv6.h */
struct in6_addr {
	__u8 s6_addr[16];
};

struct ipv6hdr {
	__u8 priority : 4, version : 4;
	__u8 flow_lbl[3];
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	struct in6_addr saddr;
	struct in6_addr daddr;
};

struct ipv6_opt_hdr {
	__u8 nexthdr;
	__u8 hdrlen;
};

/* include/uapi/linux/in6.h: the options the kernel knows with these
 * lengths or actions (net/ipv6/exthdrs.c). */
#define IPV6_TLV_PAD1 0
#define IPV6_TLV_PADN 1
#define IPV6_TLV_ROUTERALERT 5
#define IPV6_TLV_JUMBO 194
#define IPV6_TLV_HAO 201

/* include/net/ipv6.h */
#define IP6_OFFSET 0xFFF8
#define IP6_MF 0x0001

struct frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 identification;
};

/* include/uapi/linux/udp.h */
/* include/uapi/linux/ip.h: the Authentication Header (RFC 4302 §2), in
 * IPv4 and IPv6 alike; its length counts 4-byte words, minus 2. */
struct ip_auth_hdr {
	__u8 nexthdr;
	__u8 hdrlen;
	__be16 reserved;
	__be32 spi;
	__be32 seq_no;
};

struct udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__u16 check;
};

/* include/uapi/linux/tcp.h (little-endian bitfield order) */
struct tcphdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u16 res1 : 4, doff : 4, fin : 1, syn : 1, rst : 1, psh : 1, ack : 1, urg : 1, ece : 1, cwr : 1;
	__be16 window;
	__u16 check;
	__be16 urg_ptr;
};

#endif /* __TL_KERNEL_H */
