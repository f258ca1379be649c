// The recent rate and its latch, per CPU as the program keeps them
// (docs/design.md §9; bpf/smooth_rate.h).

package model

import "github.com/tierlimit/tierlimit/tiers"

// refresh computes the per-tick estimate when the window or the tick
// changed since the last one, as the program does per CPU at the first
// packet of a tick, from the counts so far, this packet's included: the
// coefficients of the in-budget count and of all selected packets, the
// recent rate's reference, and whether the rate is read from the clock.
//
// The reference outlives the window (docs/design.md §9): at the first
// refresh of a window that follows the one refreshed last, its counts,
// and the origin's, are moved down by the previous window's final counts
// (all selected packets; in-budget ones less the budgets spent at the
// last refresh), so that the rate is measured across the boundary as
// within a window. A reference of an older window, or a candidate not
// refreshed for two spans (idle), starts again at this tick, before this
// packet, and unlatched.
func (m *Model) refresh(nowNs uint64) {
	tick := nowNs / m.tickNs
	if m.coefID == m.opened && m.coefTick == tick {
		return
	}
	a, l := m.count+m.ex, m.live(m.count)
	stale := m.coefID != m.opened && m.coefID+1 != m.opened
	if m.coefID != m.opened && !stale {
		da, dl := m.prev+m.prevEx, m.prev-min(m.prev, m.xh)
		m.refA, m.candA, m.oA = m.refA-da, m.candA-da, m.oA-da
		m.refN, m.candN, m.oM = m.refN-dl, m.candN-dl, m.oM-dl
	}
	m.coefID, m.coefTick = m.opened, tick
	st := tiers.SmoothState{Elapsed: tick - min(tick, m.startTick), Ticks: m.ticks(), Gap: m.gap, Prev: m.prev}
	m.coef = st.Coef()
	if m.sketch != nil {
		// Budgets front-load the in-budget packets: S takes the previous
		// window's share from its profile (docs/design.md §6).
		m.prof.Record(st.Elapsed, st.Ticks, m.count)
		m.coef.Base = m.profPrev.Base(st.Prev, st.Elapsed, st.Ticks, st.Gap)
	}
	st.Prev += m.prevEx
	m.coefTot = st.Coef()
	d := max(st.Ticks/16, 1)
	switch {
	case stale || tick >= m.candTick+2*d || tick < m.candTick:
		m.refTick, m.refA, m.refN = tick, a-min(a, 1), l-min(l, 1)
		m.candTick, m.candA, m.candN = m.refTick, m.refA, m.refN
		m.latched, m.lat = false, 0
	case tick >= m.candTick+d:
		m.refTick, m.refN, m.refA = m.candTick, m.candN, m.candA
		m.candTick, m.candN, m.candA = tick, l, a
	}
	m.kRate = tiers.SmoothRecentMult(st.Ticks, tick-min(tick, m.refTick))
	m.clock = m.latched && tick >= m.oTick && tick-m.oTick < tiers.SmoothClockTicks
	m.xh = m.exhIn
	m.exR = 0
}

// live is the in-budget count n less the budgets of the groups that have
// spent theirs (inEstimate).
func (m *Model) live(n uint64) uint64 { return n - min(n, m.exhIn) }

// since is x − ref, or 0 when ref is past x: the counts are moved down by
// a window's at its end (refresh), and may wrap.
func since(x, ref uint64) uint64 {
	if d := x - ref; int64(d) > 0 {
		return d
	}
	return 0
}

// recent returns the count of all selected packets since the reference,
// and the rates of all selected packets a and of live in-budget packets l
// projected over a window: from the clock since the origin in the
// tiers.SmoothClockTicks ticks after a latch (l's as tiers.SmoothClockLive
// reads it), else per tick since the reference (tiers.SmoothRecentMult).
func (m *Model) recent(nowNs, a, l uint64) (ca, ea, el uint64) {
	if m.clock {
		ns := nowNs - min(nowNs, m.oNs)
		ca = since(a, m.oA)
		return ca, tiers.SmoothClockRate(ca, ns, m.window), tiers.SmoothClockLive(since(l, m.oM), ns, m.window)
	}
	ca = since(a, m.refA)
	return ca, mulShift(ca, m.kRate), mulShift(since(l, m.refN), m.kRate)
}

// latch updates the onset on the count of all selected packets a (this
// packet's included) and returns E, the rate of all selected packets, and
// the live in-budget rate, both over a window (docs/design.md §9). An
// onset is a step in the recent rate: E past 5/4 of S and, latched, past
// twice the E it latched at (a step on a step, or on a latch of noise;
// not a flood's noise, which would keep the rate on the clock);
// it latches, and the origin moves to this packet, so that the rate after
// the step is read from the clock, unmixed with the ticks before it.
// Latched, it releases when E falls to S (tiers.SmoothReleases). The
// latch outlives the window; onset, the window's flag the agent reads
// (tiers.Window), is set at a latch in the window, as the program sets
// tl_window.onset.
func (m *Model) latch(nowNs, a uint64) (ea, el uint64) {
	l := m.live(m.count)
	ca, ea, el := m.recent(nowNs, a, l)
	s := m.coefTot.Sliding(a)
	switch {
	case tiers.SmoothLatchesFrom(ca, tiers.FleetLatchMin(m.members), ea, s) && ea > 2*m.lat:
		m.latched, m.onset, m.lat = true, true, ea
		tick := nowNs / m.tickNs
		m.oTick, m.oNs, m.oA, m.oM = tick, nowNs, a, l
		m.refTick, m.refA, m.refN = tick, a, l
		m.candTick, m.candA, m.candN = tick, a, l
		m.clock = true
	case m.latched && tiers.SmoothReleasesFrom(ca, tiers.FleetLatchMin(m.members), ea, s):
		m.latched, m.lat = false, 0
	}
	return ea, el
}

// inEstimate is R̂ of the in-budget count n with budgets on, given the
// live in-budget rate el over a window: the sliding count S, and while
// latched x + el when that is more, x = min(exhIn, n).
//
// Only the packets of groups still within their budget are projected: a
// group that spent its budget (tiers.Sketch.OverSpent) adds no in-budget
// packet in this window any more, so its budget counts once, as it is.
// A flood's budget, spent in its first milliseconds, is thus not read as
// a rate that sheds the light groups (docs/design.md §6); a surge from
// many groups, each within its budget, keeps its rate, and is judged on
// it as a surge without budgets is.
func (m *Model) inEstimate(n, el uint64) uint64 {
	s := m.coef.Sliding(n)
	if !m.latched {
		return s
	}
	return max(min(m.exhIn, n)+el, s)
}
