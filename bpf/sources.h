/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Per-source budgets (docs/design.md §6).
 *
 * A packet's source group is its source address masked per family. The
 * group's count in the current window is estimated by a count-min sketch:
 * TL_SKETCH_ROWS rows of TL_SKETCH_COLS cells (maps.h tl_sketch), row r
 * placing the group by source_cells with its own seeds. tiers.SourceColumn
 * and tiers.Sketch are the same functions in Go. Each cell carries the window id it counts for
 * (source_window, window.h), so the sketch is never cleared: a cell of
 * another window counts as 0 and is reset by the first packet that touches
 * it. */
#ifndef __TL_SOURCES_H
#define __TL_SOURCES_H

#include "maps.h"
#include "parse.h"
#include "record.h"
#include "verdict.h"
#include "window.h"
#include "smooth.h"

/* The cells of a group, one per row: row r's column is the multiply-shift
 * hash (Dietzfelbinger et al. 1997; Thorup 2015, "High speed hashing for
 * integers and strings", vector multiply-shift), strongly universal over
 * the key (x_0..x_3, family): (a_0 x_0 + a_1 x_1 + a_2 x_2 + a_3 x_3 + a_4
 * [IPv6] + b) mod 2^64, top TL_SKETCH_COL_BITS bits, with 64-bit seeds
 * a_i, b of the row and the 32-bit address words x_i (IPv4: x_0 only).
 * Pairwise independence per row is what the count-min sketch's analysis
 * needs; the products do not depend on each other, so the rows cost a few
 * cycles each. The family is tested once for all rows, so that an IPv4
 * group loads no word it does not hash. key[r] is row r's cell,
 * r * TL_SKETCH_COLS + column. */
static __always_inline void source_cells(const struct tl_src_key *k, const struct tl_settings *s,
					 __u32 key[TL_SKETCH_ROWS])
{
	const __u64 *a = s->src_seeds;
	__u64 h[TL_SKETCH_ROWS];
	__u64 x0 = k->addr[0];
	if (k->family == 6) {
		__u64 x1 = k->addr[1], x2 = k->addr[2], x3 = k->addr[3];
#pragma unroll
		for (__u32 r = 0; r < TL_SKETCH_ROWS; r++, a += TL_SEED_WORDS_N)
			h[r] = a[5] + a[0] * x0 + a[1] * x1 + a[2] * x2 + a[3] * x3 + a[4];
	} else {
#pragma unroll
		for (__u32 r = 0; r < TL_SKETCH_ROWS; r++, a += TL_SEED_WORDS_N)
			h[r] = a[5] + a[0] * x0;
	}
#pragma unroll
	for (__u32 r = 0; r < TL_SKETCH_ROWS; r++)
		key[r] = r * TL_SKETCH_COLS + (__u32)(h[r] >> (64 - TL_SKETCH_COL_BITS));
}

_Static_assert((TL_SKETCH_ROWS & (TL_SKETCH_ROWS - 1)) == 0,
	       "sketch_over masks a cell's index with the sketch's size, a power of two");

/* The packet's source group (group_of6 for IPv6, record.h). The address
 * words are loaded as they lie in the header and masked with masks
 * tiers.Compile encoded the same way (tiers.SourceBudget.Group). */
static __always_inline void source_group(const struct pkt *p, const struct tl_settings *s,
					 struct tl_src_key *k)
{
	if (p->l3proto == ETH_P_IP) {
		const struct iphdr *ip = p->l3;
		if ((void *)(ip + 1) > p->end)
			return;
		k->addr[0] = ip->saddr & s->src_mask4;
		k->family = 4;
		return;
	}
	const struct ipv6hdr *ip6 = p->l3;
	if ((void *)(ip6 + 1) > p->end)
		return;
	k->family = group_of6((const __u32 *)&ip6->saddr, s->src_mask4, s->src_mask6, k->addr);
}

/* Adds segs (a super-packet's datagrams) to a cell for window wid (already
 * shifted above the count),
 * whose value the caller just read as old, and returns the cell's count for
 * that window, this packet included.
 *
 * Accepted races: a cell of an old window is reset by compare-and-swap to
 * (wid, 1); a CPU that loses the swap adds to what the winner wrote. A CPU
 * that read a current cell and adds just after another CPU reset it for a
 * newer window (a window boundary) adds to the newer window: an
 * overestimate of one, which a count-min sketch allows anyway. A cell
 * that holds TL_CELL_FULL or more of its window (bytes, under count:
 * bytes) is over any budget (tiers.MaxBudgetBytes is below it) and is
 * not added to, so that its count, with what CPUs racing past the check
 * add (2^30 more: 16384 of the largest datagrams), never carries into the
 * window id. */
static __always_inline __u32 sketch_add(__u64 *cell, __u64 old, __u64 wid, __u32 segs)
{
	int cur = (old >> TL_CELL_COUNT_BITS) == (wid >> TL_CELL_COUNT_BITS);
	if (cur && (__u32)old >= TL_CELL_FULL)
		return (__u32)old;
	if (!cur && __sync_bool_compare_and_swap(cell, old, wid | segs))
		return segs;
	__u64 v = __sync_fetch_and_add(cell, segs) + segs;
	if ((v >> TL_CELL_COUNT_BITS) != (wid >> TL_CELL_COUNT_BITS))
		return segs; /* a newer window's cell: nothing of ours in it */
	return (__u32)v;
}

/* Counts the packet's segs datagrams in its group's cells for window id
 * and returns whether the group is over budget: whether the least of its
 * cells (never below the group's true count) exceeds the budget, this
 * packet included. A super-packet is over budget whole when its last
 * datagram is (it passes or drops whole, as in the window).
 *
 * Accepted race: a packet is within budget when it is among the first
 * budget packets of any one row, and CPUs racing on one group can reach
 * the rows in different orders, so a group may get a few packets over its
 * budget per window: at most what other CPUs count while one packet is
 * between its first and last row (nanoseconds; an interrupt's length at
 * worst). A group alone in its cells never gets fewer than its budget:
 * each row admits exactly its first budget increments.
 *
 * A group already over budget in every one of its cells is judged by plain
 * reads and not added: its cells all exceed the budget already, so adding
 * changes no decision, for it or for any group that shares a cell. The
 * flood's own packets thus touch the sketch without atomics, and counts
 * stop just above the budget. tiers.Sketch.Count does the same. A stale
 * read only sees a lower count (or an older window, read as 0), which
 * sends the packet to the atomic path. */
static __always_inline int sketch_over(const struct tl_src_key *k, const struct tl_settings *s,
				       struct tl_window *w, __u64 id, __u32 segs)
{
	__u64 wid = (__u64)(__u32)id << TL_CELL_COUNT_BITS;
	__u64 *cells[TL_SKETCH_ROWS];
	__u64 vals[TL_SKETCH_ROWS];
	__u32 est = 0xffffffff;
	__u32 key[TL_SKETCH_ROWS];
	source_cells(k, s, key);
#pragma unroll
	for (__u32 r = 0; r < TL_SKETCH_ROWS; r++) {
		/* the mask only tells the verifier what the hash's shift does
		 * (a power of two: the assertion below) */
		__u64 *cell = &tl_sketch[key[r] & (TL_SKETCH_ROWS * TL_SKETCH_COLS - 1)];
		cells[r] = cell;
		__u64 v = READ_ONCE(*cell);
		vals[r] = v;
		__u32 c = (v >> TL_CELL_COUNT_BITS) == (wid >> TL_CELL_COUNT_BITS) ? (__u32)v : 0;
		if (c < est)
			est = c;
	}
	if (est > s->src_budget)
		return 1;

	est = 0xffffffff;
#pragma unroll
	for (__u32 r = 0; r < TL_SKETCH_ROWS; r++) {
		__u32 c = sketch_add(cells[r], vals[r], wid, segs);
		if (c < est)
			est = c;
	}
	/* The smooth shape's exhausted groups (docs/design.md §6): the packet
	 * whose add takes the group's estimate to the budget (from below it)
	 * ends the group's in-budget count for this window, which adds the
	 * budget to exh_in, so that sm_in_estimate does not extrapolate
	 * it. The estimate is the sketch's, never below the group's true
	 * count: a group that shares its cells reaches the budget early and
	 * adds more than its true in-budget count, which lowers the
	 * extrapolated part by that much (the light groups' side; the group
	 * is shed from there on anyway). A group whose cells all pass the
	 * budget before its own packets reach it (other groups' adds in
	 * between) is never counted: its in-budget packets are extrapolated
	 * as before. Accepted race: two CPUs that add to the group's rows in
	 * different orders can both read the budget as the least of their
	 * returns, and add it twice (same side as the overestimate). One
	 * shared atomic per group and window: not on a flood's path. */
	if (s->shape == TL_SHAPE_SMOOTH && est >= s->src_budget && est - segs < s->src_budget)
		__sync_fetch_and_add(&w->exh_in, s->src_budget);
	return est > s->src_budget;
}

/* Adds packets over budget in window id to group k's entry of source_top:
 * once per run of a group on a CPU (source_top_add), so atomics. The
 * window only moves forward, by compare-and-swap, and the CPU that moves
 * it counts the window: a run of an older window that ends after a newer
 * one was put adds its packets only (its window was counted, unless no
 * run of it ended first).
 * Two CPUs that miss at once both insert: the second insert fails
 * (BPF_NOEXIST), and that CPU adds to the entry the first one made. */
static __always_inline void source_top_put(const struct tl_src_key *k, __u64 id, __u64 packets)
{
	struct tl_src_top *t = bpf_map_lookup_elem(&source_top, k);
	if (!t) {
		struct tl_src_top n = { .packets = packets, .last_window = id, .windows = 1 };
		if (!bpf_map_update_elem(&source_top, k, &n, BPF_NOEXIST))
			return;
		/* Another CPU inserted it first: add to its entry. */
		t = bpf_map_lookup_elem(&source_top, k);
		if (!t)
			return;
	}
	__sync_fetch_and_add(&t->packets, packets);
	__u64 last = READ_ONCE(t->last_window);
	if (last < id && __sync_bool_compare_and_swap(&t->last_window, last, id))
		__sync_fetch_and_add(&t->windows, 1);
}

static __always_inline int same_group(const struct tl_src_key *a, const struct tl_src_key *b)
{
	return a->addr[0] == b->addr[0] && a->addr[1] == b->addr[1] && a->addr[2] == b->addr[2] &&
	       a->addr[3] == b->addr[3] && a->family == b->family;
}

/* Remembers a group over budget in window id for tierlimit status --top.
 * A flood from one source is a run of its packets on each CPU: the run's
 * first packet goes to source_top (so the group is listed at once), the
 * rest are counted in this CPU's source_run, without the hash lookup, and
 * added to source_top when the CPU's run ends (another group over budget,
 * or a new window). bpf.TopSources adds the runs still open. A
 * super-packet counts its segs datagrams. */
static __always_inline void source_top_add(const struct tl_src_key *k, __u64 id, __u32 segs)
{
	__u32 zero = 0;
	struct tl_src_run *r = bpf_map_lookup_elem(&source_run, &zero);
	if (!r) {
		source_top_put(k, id, segs);
		return;
	}
	if (r->window == id && r->key.family && same_group(&r->key, k)) {
		r->packets += segs;
		return;
	}
	if (r->packets)
		source_top_put(&r->key, r->window, r->packets);
	source_top_put(k, id, segs);
	r->key = *k;
	r->window = id;
	r->packets = 0;
}

/* Judges a selected packet against its group's budget. Returns -1 when it
 * is within budget (it goes on to the window and the tiers), or the XDP
 * action for a packet over budget: dropped in enforce mode, passed in
 * dry-run (would_drop) and off, counted in source_stats and never in the
 * window. A super-packet (segs datagrams, super_segments) is charged segs
 * everywhere: in the sketch, the over-budget counts and source_top. A shed
 * packet is sampled (record.h), with pri its <PRI> (parse_pri;
 * negative for none). A first fragment's verdict is remembered for its
 * followers. A stage stop returns XDP_DROP, an action, which tl_judge
 * returns. */
static __always_inline int source_budget(struct xdp_md *ctx, const struct pkt *p, const struct tl_settings *s,
					 __u32 slot, struct tl_window *w, __u64 bytes, int pri, __u32 segs)
{
	struct tl_src_key k = {};
	source_group(p, s, &k);
	__u64 tick;
	__u64 id = source_window(w, s, &tick);
	TL_STAGE(TL_STAGE_GROUP, XDP_DROP);
	int over = sketch_over(&k, s, w, id, p->wt);
	TL_STAGE(TL_STAGE_SKETCH, XDP_DROP);
	if (!over)
		return -1;

	/* Over budget: judged on the capacity in-budget traffic leaves
	 * (smooth.h over_budget_thr), never counted in the window's n. */
	__u32 thr = TL_THR_ALWAYS, verdict = TL_PASS;
	int drop = 0;
	if (!over_budget_thr(w, s, slot, id, tick, p->wt, &thr, &drop))
		drop = s->mode != TL_MODE_OFF; /* at TL_THR_ALWAYS */
	if (drop)
		verdict = mode_verdict(s);
	count(&source_stats, verdict, segs, bytes);
	count(&bytes_stats, verdict, segs, p->plen);
	if (verdict != TL_PASS && s->rec_samples && record_token(s))
		tl_record(ctx, record_meta(p, (void *)(long)ctx->data, slot, TL_RECORD_NONE, TL_REASON_OVER_BUDGET,
					   verdict, pri), thr);
	source_top_add(&k, id, segs);
	if (p->frag == FRAG_FIRST)
		remember_first(p, verdict);
	return xdp_action(verdict);
}

#endif /* __TL_SOURCES_H */
