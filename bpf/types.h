/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Structs and enums shared between the XDP program and Go. bpf2go generates
 * the Go declarations from these (-type in gen.go), so the layouts have one
 * source. Every field is naturally aligned: no implicit padding. */
#ifndef __TL_TYPES_H
#define __TL_TYPES_H

#include "include/tl_kernel.h"
#include "consts.h"
#include "types_record.h"
#include "types_sources.h"

/* The limits and key encodings that Go must agree with, exported to Go as
 * LimiterTlConst* (bpf2go -type tl_const). */
enum tl_const {
	TL_C_MAX_TIERS = TL_MAX_TIERS,
	TL_C_MAX_RULES = TL_MAX_RULES,
	TL_C_TABLE_MAX = TL_TABLE_MAX,
	TL_C_SLOTS = TL_SLOTS,
	TL_C_LPM_ENTRIES = TL_LPM_ENTRIES,
	TL_C_LOCAL_PREFIXES = TL_LOCAL_PREFIXES,
	TL_C_FRAG_ENTRIES = TL_FRAG_ENTRIES,
	/* ports key: ((slot * 2 + is_tcp) * TL_PORT_KEYS) + destination port */
	TL_PORT_KEYS = 65536,
	/* tier_table key: slot * TL_TABLE_MAX + entry */
	/* LPM keys: prefixlen counts the tag's bits before the address's */
	TL_LPM_TAG_BITS = 32,
	TL_LPM_ADDR_BITS = 128,
	/* select_dests tag: slot << TL_DEST_RULE_BITS (the rule bits below are
	 * 0: one entry per destination holds its rules); exempt tag: slot */
	TL_DEST_RULE_BITS = 8,
	/* settings.shift is applied modulo 64 (a u64 shift), so the verifier
	 * sees a bounded shift */
	TL_SHIFT_MASK = 63,
	TL_C_SKETCH_ROWS = TL_SKETCH_ROWS,
	TL_C_SKETCH_COLS = TL_SKETCH_COLS,
	TL_C_SRC_TOP_ENTRIES = TL_SRC_TOP_ENTRIES,
	TL_C_LRU_LOCAL_FREE = TL_LRU_LOCAL_FREE,
	/* tl_sketch index: row * TL_SKETCH_COLS + column; a cell is a u64,
	 * the count in its low TL_CELL_COUNT_BITS, the window id above */
	TL_CELL_COUNT_BITS = 32,
	TL_C_SKETCH_COL_BITS = TL_SKETCH_COL_BITS,
	TL_SEED_WORDS = TL_SEED_WORDS_N,
	TL_C_FRAG_TTL_MS = TL_FRAG_TTL_MS,
	TL_C_SKB_IFACES = TL_SKB_IFACES,
	TL_C_IFACES = TL_IFACES,
	/* LPM tag bit of an IPv6 prefix or address; IPv4 ones leave it clear,
	 * so a prefix only ever matches packets of its own family */
	TL_LPM_TAG_IPV6 = 1 << 30,
	TL_C_MAX_CPUS = TL_MAX_CPUS,
	TL_C_SMOOTH_FRAC_BITS = TL_SMOOTH_FRAC_BITS,
	TL_C_SMOOTH_MIN_FRAC = TL_SMOOTH_MIN_FRAC,
	TL_C_SMOOTH_ONSET_MIN = TL_SMOOTH_ONSET_MIN,
	TL_C_SMOOTH_TICK_SHIFT = TL_SMOOTH_TICK_SHIFT,
	TL_C_SMOOTH_PROF_N = TL_SMOOTH_PROF_N,
	TL_C_FLEET_MULT_SHIFT = TL_FLEET_MULT_SHIFT,
	TL_C_FLEET_RHAT_SHIFT = TL_FLEET_RHAT_SHIFT,
	TL_C_SMOOTH_LATCH_SHIFT = TL_SMOOTH_LATCH_SHIFT,
	TL_C_SMOOTH_CLOCK_BITS = TL_SMOOTH_CLOCK_BITS,
	TL_C_RECORD_SNAP_MAX = TL_RECORD_SNAP_MAX,
	/* tl_sample.tier, .sev and .facility when unknown (over budget,
	 * fragments; no <PRI>) */
	TL_RECORD_NONE = 0xff,
	/* tl_sample.format of this program's samples: 2 added facility and
	 * pass; an older program's (format 1) hold 0 there (its padding) */
	TL_SAMPLE_FORMAT = 2,
	/* tl_settings.sev_on: bit 0 severity on; from this bit, bit f set for
	 * each protected facility f (0..23) */
	TL_SEV_FAC_SHIFT = 8,
};

/* Drop thresholds on the bpf_get_prandom_u32() scale (tl_entry.thr). */
enum tl_thr {
	TL_THR_NEVER = 0,           /* tier 0 and drop 0%: never drops */
	TL_THR_ALWAYS = 0xffffffffU, /* drop 100%: always, whatever the draw */
};

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

/* Severity classes of UDP syslog (docs/design.md §7); values match
 * tiers.SeverityClass. */
enum tl_sev_class {
	TL_SEV_NORMAL = 0,     /* no list, or no valid <PRI> */
	TL_SEV_PROTECTED = 1,  /* passes a drop verdict while the debt allows */
	TL_SEV_SHED_FIRST = 2, /* judged at the next tier's rate */
	TL_SEV_CLASSES = 3,
};

/* Indexes of severity_stats: class * TL_VERDICTS + verdict, then these. */
enum tl_sev_stat {
	TL_SEV_PROTECTED_PASS = TL_SEV_CLASSES * TL_VERDICTS, /* drop verdicts passed by protection */
	TL_SEV_PAID_DROP = TL_SEV_PROTECTED_PASS + 1,         /* pass verdicts dropped to pay the debt */
	TL_SEV_STATS = TL_SEV_PROTECTED_PASS + 2,
};

/* Indexes of malformed_stats: frames whose length fields disagree with the
 * frame or with each other. The kernel discards them, so they pass
 * uncounted; tiny fragments are the exception (TL_MAL_TINY_FRAGMENT). */
enum tl_malformed {
	TL_MAL_IPV4_LENGTH = 0, /* total length < IHL * 4, or past the frame */
	TL_MAL_IPV6_LENGTH = 1, /* payload length past the frame, or shorter than its extension headers */
	TL_MAL_UDP_LENGTH = 2,  /* UDP length < 8 or past the IP payload; IP payload < 8 */
	TL_MAL_TCP_LENGTH = 3,  /* data offset < 5 or past the IP payload; IP payload < 20 */
	/* RFC 1858: a first fragment too short for its UDP or TCP header, or a
	 * TCP fragment at offset 8 bytes. Dropped in enforce mode, whatever
	 * the port: no stack sends them, and they hide the header the
	 * limiter judges (a SYN's flags). */
	TL_MAL_TINY_FRAGMENT = 4,
	TL_MAL_IPV4_CHECKSUM = 5, /* the IPv4 header checksum fails (ip_rcv_core) */
	TL_MAL_MAX = 6,
};

/* Indexes of unclassified_stats: frames that Linux may deliver but whose
 * destination port the program cannot tell (docs/design.md §2). They are judged
 * as selected, and counted here besides their tier and verdict. */
enum tl_unclassified {
	TL_UNCL_VLAN_DEPTH = 0,     /* more VLAN tags than TL_VLAN_MAX */
	TL_UNCL_IPV6_CHAIN = 1,     /* more IPv6 extension headers than TL_IPV6_EXT_MAX */
	TL_UNCL_FRAGMENT_CHAIN = 2, /* an IPv6 first fragment whose header chain goes on in a later fragment */
	TL_UNCL_MAX = 3,
};

/* tl_port.flags */
enum tl_port_flag {
	TL_PORT_PACKETS = 1, /* a rule without dests counts every packet */
	TL_PORT_SYN = 2,     /* a rule without dests counts TCP SYN without ACK */
};

/* tl_settings.flags */
enum tl_settings_flag {
	TL_HAS_EXEMPT = 1, /* the exempt trie holds prefixes for this slot */
	TL_ANY_DEST = 2,   /* a select rule without dests: it counts unclassified frames to any destination */
	TL_COUNT_BYTES = 4, /* count: bytes: a packet weighs its L4 payload's bytes, not 1 (docs/design.md §2) */
};

/* bytes_stats keys: the payload bytes (and datagrams) of selected packets
 * by verdict, tiers and over-budget alike, and of the TCP segments that
 * count: bytes counts but never sheds (docs/design.md §2, §5). */
enum tl_bytes_stat {
	TL_BYTES_TCP_COUNTED = TL_VERDICTS, /* after the verdicts: a segment of a syn rule's connection */
	TL_BYTES_STATS = TL_VERDICTS + 1,
};

/* What the program checks of a frame on an interface the agent described
 * (host.h): bits of the word tl_if_word holds, from bit TL_IF_FLAG_SHIFT;
 * the bits below hold the interface's MAC. */
enum tl_if_flag {
	TL_IF_MAC = 1,      /* a unicast MAC not the interface's is another host's (no rx_handler takes it) */
	TL_IF_MARTIAN = 2,  /* the addresses Linux always discards (not loopback, not an L3 master) */
	TL_IF_LOCALNET = 4, /* 127.0.0.0/8 too: route_localnet is off on the interface and in all */
	TL_IF_FLAG_SHIFT = 48,
};

/* Packets and bytes (L2 frame length), one per-CPU slot of a stats map. */
struct tl_stat {
	__u64 packets;
	__u64 bytes;
};

/* The one window shared by all CPUs. start_ns and count change atomically;
 * last_count and opened are written only by the CPU that opened the window.
 * Past the last table entry's first n, packets are counted per CPU in the
 * overflow map instead of in count (window.h window_count): the window's
 * offered load is count plus the overflow of every CPU for this window. */
struct tl_window {
	__u64 start_ns;   /* clock of the packet that opened the window, ns */
	__u64 count;      /* selected packets in this window so far */
	__u64 last_count; /* final count of the previous window */
	__u64 opened;     /* windows opened since the maps were created */
	__u64 start_jiffies; /* bpf_jiffies64() read just before start_ns; 0: opened under the clock (window.h window_start_tick) */
	__u64 debt;          /* severity: protected passes not yet paid off */
	__u64 overflowed;    /* opened + 1 once a CPU counted in the overflow map in this window; else less */
	/* The shape and the budgets that share (docs/design.md §6, §9), written by
	 * the opener but for ex_count and onset: */
	__u64 start_tick; /* the window's first tick: start_jiffies, or start_ns >> TL_SMOOTH_TICK_SHIFT */
	__u64 gap;        /* ticks between the previous window's end and this one's start */
	__u64 expect_in;  /* the previous window's count, less the gap's share: this window's expected in-budget count */
	__u64 onset;      /* opened + 1 once the window is latched as an onset (smooth) */
	__u64 ex_count;   /* over-budget packets counted on the shared line (ordinal, below saturation) */
	__u64 prev_ex;    /* the previous window's ex_count */
	__u64 exh_in;     /* smooth with budgets: in-budget packets of groups that spent their budget (sources.h) */
};

/* One CPU's packets past saturation (window.h window_count), for the
 * window with opened == window[opened & 1] in packets[opened & 1]: two
 * slots, so that the previous window's count survives the next one's first
 * packet until the agent reads it. Padded to two cache lines so that no two
 * CPUs' counts share a line, however the array is aligned. */
struct tl_overflow {
	__u64 window[2];  /* tl_window.opened of the window counted in packets[i] */
	__u64 packets[2]; /* packets of that window this CPU counted */
	__u64 ex[2];      /* over-budget packets of that window this CPU counted */
	__u64 _pad[10];
};

/* The packet's header fields packed for the judgement (parse.h pkt_pack),
 * handed across the tail call to tl_judge_tail (maps.h tl_judge_args). */
struct tl_judge_args {
	__u64 a1;
	__u64 a2;
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
	/* For tierlimit status only, never read by the program: the first n of
	 * tiers 1..tiers as the table applies them, and each tier's threshold. */
	__u64 bounds[TL_MAX_TIERS];
	__u32 drops[TL_MAX_TIERS + 1];
	__u32 dest_rules; /* bit i: select rule i has dests (unclassified frames to them are counted) */
	/* Severity (docs/design.md §7), read only when sev_on: the most drop debt
	 * a window may carry, packets; the threshold of a shed-first datagram
	 * in each tier; sev_on's bit 0, and from bit TL_SEV_FAC_SHIFT the
	 * facilities protected whatever their severity (bit f: facility f);
	 * the class (enum tl_sev_class) of each severity 0..7. */
	__u64 protect_budget;
	__u32 shed_drops[TL_MAX_TIERS + 1];
	__u32 sev_on;
	__u8 sev_class[8];
	/* Per-source budgets (docs/design.md §6), as tiers.SourceBudget encodes
	 * them. src_budget 0: off, and nothing below is read. */
	__u32 src_budget;    /* packets per source group and window */
	__u32 src_mask4;     /* IPv4 group mask, network order as loaded */
	__u32 src_mask6[4];  /* IPv6 group mask, the same per 32-bit word */
	__u32 src_prefix_v4; /* prefix lengths; for tierlimit status */
	__u32 src_prefix_v6;
	/* hash seeds: row r uses [r * TL_SEED_WORDS, (r + 1) * TL_SEED_WORDS) */
	__u64 src_seeds[TL_SKETCH_ROWS * TL_SEED_WORDS_N];
	/* The saturated window's fast path (window.h window_count): the first
	 * n of the table's last entry, tiers.Table.TierStart(tiers), and that
	 * entry's threshold and tier. */
	__u64 last_n;
	__u32 last_thr;
	__u32 last_tier;
	__u32 nr_cpus; /* entries of the overflow map to sum: possible CPUs, at most TL_MAX_CPUS */
	__u32 shape;   /* enum tl_shape; under TL_SHAPE_SMOOTH tier_table and shed_drops hold q's thresholds */
	/* The smooth shape (smooth.h, tiers.SmoothTable): ticks in a window
	 * (at least 1); the first R̂ past the table; P there, 16 fractional
	 * bits (16 − sm_pass_shift past 2^46 packets: smooth.h); the last
	 * tier's pass probability, 16 fractional bits, which the program no
	 * longer reads (it takes last_thr's 32). */
	__u64 sm_ticks;
	__u64 sm_last_n;
	__u64 sm_pass_base;
	__u64 sm_pass_last;
	/* The shed record (docs/design.md §10, record.h): samples per second in
	 * all (0: off, and nothing below is read), bytes kept of each frame
	 * (at most TL_RECORD_SNAP_MAX), and the masks of a sample's source
	 * group (the sources' prefixes, encoded as src_mask4 and src_mask6).
	 * The cap's gate (record_gate, a GCRA): one sample every
	 * rec_interval_ns, rec_tau_ns of burst tolerance ((burst - 1) ×
	 * interval), on a clock of bpf_jiffies64() × rec_tick_ns (one load,
	 * where bpf_ktime_get_ns costs tens of ns in a VM; 0: ktime). */
	__u32 rec_samples;
	__u32 rec_snaplen;
	__u32 rec_mask4;
	__u32 rec_mask6[4];
	__u32 rec_prefixes; /* the masks' lengths: v4 | v6 << 8 */
	__u64 rec_interval_ns;
	__u64 rec_tau_ns;
	__u64 rec_tick_ns;
};

/* One entry of a compiled tier table. */
struct tl_entry {
	__u32 thr;  /* drop if bpf_get_prandom_u32() < thr; enum tl_thr */
	__u32 tier; /* tier number, 0 = below the first threshold */
};

/* What select rules say about one (protocol, destination port). */
struct tl_port {
	__u32 flags;      /* enum tl_port_flag, for rules without dests */
	__u32 cidr_rules; /* bit i: rule i (with dests) selects this port */
};

/* Key of the exempt and dests LPM tries. IPv4 addresses are stored as
 * IPv4-mapped IPv6 (::ffff:a.b.c.d), and the family is in the tag
 * (TL_LPM_TAG_IPV6), so an IPv4 prefix matches only IPv4 packets and an
 * IPv6 prefix (::/0, ::ffff:0:0/96 included) only IPv6 packets. prefixlen
 * counts the TL_LPM_TAG_BITS of tag before the address. */
struct tl_lpm_key {
	__u32 prefixlen;
	__u32 tag;       /* family | exempt: slot; dests: slot << 8 */
	__u8 addr[16];
};

/* The last destination dests_hold looked up in select_dests on this CPU
 * (dest_cache) and its answer: tag the family and slot, addr the
 * destination as load_addr writes it, rules the select rules whose dests
 * hold it (bit i: rule i; 0 when none does); state 0: empty, 1: rules
 * holds the answer. */
struct tl_dest_cache {
	__u32 tag;
	__u32 state;
	__u32 rules;
	__u32 pad;
	__u8 addr[16];
};

/* Identifies the fragments of one IP datagram (RFC 791, RFC 8200 §4.5). */
struct tl_frag_key {
	__u8 src[16];
	__u8 dst[16];
	__u32 id;
	__u32 proto;  /* IPv4 protocol; IPv6: the fragment header's next header */
	__u32 family; /* ETH_P_IP or ETH_P_IPV6 */
};

/* A remembered first-fragment drop (only drops are remembered: an entry
 * is one). */
struct tl_frag_verdict {
	__u64 expires_ns; /* bpf_ktime_get_ns after which it no longer holds */
	__u64 _pad;       /* zero: keeps the 16-byte value of maps pinned before */
};

/* Where a benchmark load (verdict.h tl_bench_stage) stops a packet: the
 * stages in the order a selected packet meets them. */
enum tl_stage {
	TL_STAGE_ENTRY = 1,   /* the program entered: the test run's own cost */
	TL_STAGE_PARSED = 2,  /* Ethernet to UDP/TCP parsed */
	TL_STAGE_JUDGE = 3,   /* tl_judge entered, header fields unpacked */
	TL_STAGE_POLICY = 4,  /* active slot, settings, selectors, exempt */
	TL_STAGE_GROUP = 5,   /* per-source budgets: group and window id */
	TL_STAGE_SKETCH = 6,  /* per-source budgets: sketch read and added to */
	TL_STAGE_WINDOW = 7,  /* the window's count */
};

/* bpf2go -type exports only what the object's BTF holds, and an enum is in
 * BTF only where something has its type: this struct names every enum Go
 * needs, and one pointer to it (never read) puts it in BTF. */
struct tl_contract {
	enum tl_const c;
	enum tl_thr thr;
	enum tl_verdict verdict;
	enum tl_mode mode;
	enum tl_misc misc;
	enum tl_bytes_stat bytes_stat;
	enum tl_port_flag port_flag;
	enum tl_settings_flag settings_flag;
	enum tl_if_flag if_flag;
	enum tl_sev_class sev_class;
	enum tl_sev_stat sev_stat;
	enum tl_malformed malformed;
	enum tl_unclassified unclassified;
	enum tl_stage stage;
	enum tl_shape shape;
	enum tl_reason reason;
	struct tl_sample sample; /* the ring buffer's records have no BTF of their own */
};

#endif /* __TL_TYPES_H */
