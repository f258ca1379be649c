/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Structs and enums shared between the XDP program and Go. bpf2go generates
 * the Go declarations from these (-type in gen.go), so the layouts have one
 * source. Every field is naturally aligned: no implicit padding. */
#ifndef __TL_TYPES_H
#define __TL_TYPES_H

/* The verdict of a selected packet; values match tiers.Verdict. */
enum tl_verdict {
	TL_PASS = 0,
	TL_DROP = 1,
	TL_WOULD_DROP = 2,
	TL_VERDICTS = 3,
};

/* What the program does with a packet its tier says to drop; values match
 * tiers.Mode. */
enum tl_mode {
	TL_MODE_ENFORCE = 0,
	TL_MODE_DRY_RUN = 1,
	TL_MODE_OFF = 2,
};

/* Indexes of misc_stats: packets that never enter the window. */
enum tl_misc {
	TL_MISC_UNSELECTED = 0, /* not selected, malformed, truncated, too deep */
	TL_MISC_EXEMPT = 1,     /* selected, but from an exempt source */
	TL_MISC_FRAG_PASS = 2,  /* non-first fragment passed */
	TL_MISC_FRAG_DROP = 3,  /* non-first fragment dropped after its first */
	TL_MISC_MAX = 4,
};

/* tl_port.flags */
enum tl_port_flag {
	TL_PORT_PACKETS = 1, /* a rule without dests counts every packet */
	TL_PORT_SYN = 2,     /* a rule without dests counts TCP SYN without ACK */
};

/* tl_settings.flags */
enum tl_settings_flag {
	TL_HAS_EXEMPT = 1, /* the exempt trie holds prefixes for this slot */
};

/* Packets and bytes (L2 frame length), one per-CPU slot of a stats map. */
struct tl_stat {
	__u64 packets;
	__u64 bytes;
};

/* The one window shared by all CPUs. start_ns and count change atomically;
 * last_count and opened are written only by the CPU that opened the window. */
struct tl_window {
	__u64 start_ns;   /* clock of the packet that opened the window, ns */
	__u64 count;      /* selected packets in this window so far */
	__u64 last_count; /* final count of the previous window */
	__u64 opened;     /* windows opened since the maps were created */
	__u64 start_jiffies; /* bpf_jiffies64() read just before start_ns; 0: unknown */
};

/* The policy of one slot, besides its table and its selectors. */
struct tl_settings {
	__u64 window_ns;      /* window length, ns */
	__u64 window_jiffies; /* whole ticks in a window; 0: no tick gate */
	__u32 table_len; /* entries of this slot's table; 0: no policy */
	__u32 shift;     /* the table is indexed by n >> shift */
	__u32 mode;      /* enum tl_mode */
	__u32 flags;     /* enum tl_settings_flag */
	__u32 syn_rules; /* bit i: select rule i (with dests) counts SYN only */
	__u32 tiers;     /* tiers of the policy; for tierlimit status */
	__u64 max;       /* the policy's max, packets; for tierlimit status */
};

/* One entry of a compiled tier table. */
struct tl_entry {
	__u32 thr;  /* drop if bpf_get_prandom_u32() < thr; 0xffffffff: always */
	__u32 tier; /* tier number, 0 = below the first threshold */
};

/* What select rules say about one (protocol, destination port). */
struct tl_port {
	__u32 flags;      /* enum tl_port_flag, for rules without dests */
	__u32 cidr_rules; /* bit i: rule i (with dests) selects this port */
};

/* Key of the exempt and dests LPM tries. IPv4 addresses are stored as
 * IPv4-mapped IPv6 (::ffff:a.b.c.d). prefixlen counts the 32 bits of tag. */
struct tl_lpm_key {
	__u32 prefixlen;
	__u32 tag;       /* exempt: slot; dests: slot << 8 | rule */
	__u8 addr[16];
};

/* Identifies the fragments of one IP datagram (RFC 791, RFC 8200 §4.5). */
struct tl_frag_key {
	__u8 src[16];
	__u8 dst[16];
	__u32 id;
	__u32 proto;
};

#endif /* __TL_TYPES_H */
