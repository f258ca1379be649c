/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The parsers' cursors: struct pcur, which parse_ip.h, parse.h and
 * ipv6_opts.h walk headers with (pc_at), and struct cursor, parse_pri's
 * (severity.h) over a UDP payload. */
#ifndef __TL_CURSOR_H
#define __TL_CURSOR_H

#include "include/tl_kernel.h"
#include "include/bpf_helpers.h"

/* A header cursor for parse_pri: the payload and the frame's end. */
struct cursor {
	void *pos;
	void *end;
};

/* The parsers' cursor: an offset from data, and the frame's length. Every
 * header is found at data + off, an offset the verifier takes as any
 * value up to TL_OFF_MAX (pc_at), and checked against end afresh; length
 * checks compare scalars (len), never pointers. So the verifier sees the
 * same state at each step of a walk whatever path led there, instead of
 * one state per path (a pointer whose offset, and scalars whose exact
 * values, differ on each): the cost of the IPv6 walk grows with its depth,
 * not with the number of paths through it (TestVerifierComplexity). */
struct pcur {
	struct xdp_md *ctx;
	void *data;
	void *end;
	__u32 len; /* end - data */
	__u32 off;
};

/* The furthest offset at which the parser reads a header: past it, a
 * frame is read as truncated. Below 64 KiB (MAX_PACKET_OFF) with room for
 * a header, so that the verifier can range-check data + off + len. */
#define TL_OFF_MAX 0x3fff

/* Always 0. The verifier cannot know it (a global in .bss, which nothing
 * writes), so a value that has it added is any value to the verifier:
 * pc_at adds it to the cursor, and count() to a counter's key, so that
 * neither the cursor nor a constant key makes the verifier tell apart the
 * paths that computed them. */
volatile __u32 tl_opaque;

/* len bytes at the cursor, or NULL when the frame ends first. */
static __always_inline void *pc_at(const struct pcur *c, __u32 len)
{
	__u32 off = c->off + tl_opaque;
	if (off > TL_OFF_MAX)
		return NULL;
	void *p = c->data + off;
	if (p + len > c->end)
		return NULL;
	return p;
}

#endif /* __TL_CURSOR_H */
