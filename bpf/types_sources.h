/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Structs of the per-source budgets (docs/design.md §6; sources.h) that Go
 * shares (bpf2go -type in gen.go): a part of types.h, in a file of its own
 * to keep each under 400 lines. */
#ifndef __TL_TYPES_SOURCES_H
#define __TL_TYPES_SOURCES_H

#include "include/tl_kernel.h"

/* A source group: the masked source address, as loaded from the header
 * (IPv4 in addr[0], the rest 0), and its family. Key of source_top. */
struct tl_src_key {
	__u32 addr[4];
	__u32 family; /* 4 or 6 */
};

/* A source group seen over budget, for tierlimit status --top: one CPU's
 * share of it (source_top is per CPU). */
struct tl_src_top {
	__u64 packets;     /* packets over budget, all windows */
	__u64 last_window; /* id (tl_window.opened) of the last window it was over */
	__u64 windows;     /* windows in which it was over budget */
};

/* The group this CPU last counted over budget, in window, and its packets
 * not yet added to source_top (source_run, per CPU). */
struct tl_src_run {
	struct tl_src_key key;
	__u32 pad;
	__u64 window;  /* id (tl_window.opened) of the window of the run */
	__u64 packets; /* the run's packets after its first, not yet in source_top */
};

#endif /* __TL_TYPES_SOURCES_H */
