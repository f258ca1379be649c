// Package model is the pure-Go reference model of the XDP limiter that the
// BPF tests compare against: the frame classifier (Classify, ClassifyOn),
// one limiter judging a stream of selected packets (Model) and a fleet of
// them (FleetModel), each on a policy as package tiers compiles it. Tests
// import it, and tierlimit check for the fleet's first window
// (FleetFirstWindow). It needs no kernel support and touches nothing outside
// memory.
package model

import (
	"math/bits"
	"math/rand/v2"
	"net/netip"

	"github.com/tierlimit/tierlimit/tiers"
)

// Decision is the Model's account of one selected packet.
type Decision struct {
	// N is the packet's 1-based count in its window, dropped packets
	// included.
	N uint64
	// Tier is the packet's tier from the Table, 0 below the first threshold.
	Tier int
	// Verdict is what the limiter does with the packet under the Mode.
	Verdict tiers.Verdict
	// WindowOpened is true when this packet opened a new window (N is 1).
	WindowOpened bool
	// Class is the packet's severity class (PacketSeverity), SevNormal
	// otherwise.
	Class tiers.SeverityClass
	// Protected is true when protection passed the packet although its
	// tier said drop; Paid when the packet was dropped (or would_drop)
	// although its tier said pass, to pay off the window's drop debt.
	Protected, Paid bool
	// OverBudget is true when the packet's source group had used its
	// budget in this window (docs/design.md §6). Such a packet is not counted:
	// N and Tier are 0, and Verdict is VerdictDrop, VerdictWouldDrop or
	// VerdictPass by the mode.
	OverBudget bool
	// Pass is the pass probability in force when the packet was judged,
	// as the program stores it in a sample (docs/design.md §10): ^thr of
	// the threshold it was drawn at, 0 for a Paid packet. Unset under
	// ModeOff.
	Pass uint32
}

// Model is the reference model of the XDP limiter for one stream of
// selected packets: the behaviour the BPF program must match, sequentially.
// It is not safe for concurrent use.
type Model struct {
	table  tiers.Table
	mode   tiers.Mode
	window uint64 // ns
	rand   func() uint32

	open  bool   // a window has been opened
	start uint64 // ns, clock of the packet that opened the window
	count uint64 // selected packets in the window so far
	debt  uint64 // the window's drop debt (severity)

	sources tiers.SourceBudget
	sketch  *tiers.Sketch // nil while sources are off
	w       uint64        // the weight of the packet being judged: 1, or its bytes (Weighed)
	opened  uint64        // windows opened: the sketch's window id

	ex       uint64 // over-budget packets in the window (docs/design.md §6)
	exhIn    uint64 // the budgets of groups that spent theirs in the window (smooth: inEstimate)
	expectIn uint64 // the in-budget count the window expects: the previous one's, less a gap

	// The smooth shape (docs/design.md §9): the tick, the window's, and the
	// per-tick estimate as the program keeps it per CPU.
	tickNs    uint64
	startTick uint64
	gap       uint64 // ticks between the previous window's end and this one's start
	prev      uint64 // the previous window's final count
	prevEx    uint64 // and its over-budget packets
	onset     bool
	coefID    uint64 // window id (opened) and tick of coef; coefID 0: none
	coefTick  uint64
	coef      tiers.SmoothCoef // of the in-budget count
	coefTot   tiers.SmoothCoef // of all selected packets
	exThr     uint32           // the over-budget threshold, memo of (exR, exRin)
	exR       uint64           // R̂ of all selected packets exThr was computed for; 0: none
	exRin     uint64           // and the in-budget expectation
	lastEstim uint64           // R̂ of the latest in-budget packet (smooth), the others' sum left out
	othersIn  uint64           // the fleet's others' in-budget sum (SetFleetOthers)
	lastThr   uint32           // the latest packet's drop threshold, for tests' expectations
	others    uint64           // and their total, in and over budget
	ownIn     uint64           // own R̂_in at the report the sums answer (SetFleetOwn)
	ownTot    uint64           // and own R̂_tot
	members   uint64           // the fleet's member count at the last answer, 0 without one

	// The recent rate (docs/design.md §9, tiers.SmoothRecentMult): the
	// reference sample (tick, all selected packets, in-budget packets of
	// groups within their budget) it is measured from, the next one, and
	// the per-tick multiplier that projects the count since the reference
	// over a window. The origin is where the rate is measured from the
	// clock for tiers.SmoothClockTicks ticks (the window's start or the
	// latch: tick, ns, the two counts); latched is the onset, which
	// outlives the window until the rate falls to S.
	refTick, refN, candTick, candN uint64
	refA, candA                    uint64
	kRate                          uint64
	oTick, oNs, oA, oM             uint64
	clock, latched                 bool
	lat                            uint64 // E at the latch; 0 while not latched
	xh                             uint64 // exhIn at the latest refresh

	// The profiles of the in-budget count, with budgets on
	// (tiers.SmoothProfile): the window's own, taken at refreshes, and the
	// previous window's, which the sliding count reads.
	prof, profPrev tiers.SmoothProfile
}

// NewModel returns a model of policy p compiled as t, with no window open.
// It takes Mode and Window from p and the tiers from t. rand stands for
// bpf_get_prandom_u32; nil uses math/rand/v2.
func NewModel(p tiers.Policy, t tiers.Table, rand func() uint32) *Model {
	if rand == nil {
		rand = randUint32
	}
	m := &Model{table: t, mode: p.Mode, window: uint64(p.Window), rand: rand, sources: t.Sources,
		tickNs: 1 << tiers.SmoothTickShift, w: 1}
	if t.Sources.Budget != 0 {
		m.sketch = tiers.NewSketch(tiers.SketchSeeds{})
	}
	return m
}

// SetSketchSeeds sets the seeds of the sketch rows, which the program
// draws at load (bpf.Limiter.SketchSeeds), and empties the sketch. It does
// nothing while sources are off.
func (m *Model) SetSketchSeeds(seeds tiers.SketchSeeds) {
	if m.sketch != nil {
		m.sketch = tiers.NewSketch(seeds)
	}
}

func randUint32() uint32 { return rand.Uint32() }

// Packet accounts for a selected packet that arrives at nowNs (a monotonic
// clock, ns) and returns its decision.
//
// The window rule is the seed's TrafficMonitorWindow (docs/design.md §2): the
// first packet ever opens a window, and so does the first packet that
// arrives more than Window after the current window opened (strictly:
// nowNs - start > Window; a packet at exactly start + Window stays in the
// window). Opening restarts the count, so that packet has N = 1; any other
// packet has N = count + 1. Dropped packets count too. A clock earlier than
// the window's start stays in the window.
//
// The tier and threshold come from tiers.Table.Lookup(N). Under ModeEnforce
// the verdict is VerdictDrop when tiers.Dropped(thr, rand()); under ModeDryRun
// it is VerdictWouldDrop in that case; otherwise, and always under ModeOff, it
// is VerdictPass. rand is drawn only when the outcome depends on it, that is
// when thr is neither 0 nor AlwaysDrop, and never under ModeOff.
func (m *Model) Packet(nowNs uint64) Decision {
	return m.judge(nowNs, netip.Addr{}, notUDP)
}

// Weighed is the packet of PacketFromSeverity (src invalid: no budget;
// sev notUDP, -2: no severity) with weight w: under count: bytes
// (docs/design.md §2) its L4 payload's bytes, as the program weighs it. It
// adds w where the other methods add 1: to the window's count (its N is
// the bytes counted before it plus w, so a packet of weight 0, a SYN, is
// judged at the bytes before it), to its group's cells (tiers.Sketch.AddN:
// over budget when the estimate, w included, exceeds the budget), to the
// over-budget count, and to or from the drop debt (a protected packet
// passes while the debt plus w stays within the budget; a payer takes w
// off, down to 0).
func (m *Model) Weighed(nowNs uint64, src netip.Addr, sev int, w uint32) Decision {
	m.w = uint64(w)
	d := m.judge(nowNs, src, sev)
	m.w = 1
	return d
}

// NotUDP is Weighed's sev for a packet that severity ignores (not UDP).
const NotUDP = notUDP

// Counted accounts for a TCP segment that count: bytes counts and never
// sheds (a segment of a syn rule's connection, docs/design.md §2), of
// weight w: the window rule, then w added to the window's count. It is
// judged by nothing: no budget, no tier, no verdict.
func (m *Model) Counted(nowNs uint64, w uint32) {
	if !m.open || nowNs > m.start && nowNs-m.start > m.window {
		m.openWindow(nowNs)
	}
	m.count += uint64(w)
}

// notUDP is judge's sev for a packet that severity ignores.
const notUDP = -2

// PacketFrom is Packet for a packet from source address src, which the
// per-source budget judges first (docs/design.md §6): after the window rule, the
// packet is counted in its group's sketch cells under the window's id (the
// number of windows opened so far), and when the group's estimate, this
// packet included, exceeds the budget the packet is over budget. It is
// then not counted in the window, and its verdict is VerdictDrop under
// ModeEnforce, VerdictWouldDrop under ModeDryRun and VerdictPass under
// ModeOff; rand is not drawn. The packet that opens a window is never over
// budget. An invalid src, or sources off, skips the budget.
func (m *Model) PacketFrom(nowNs uint64, src netip.Addr) Decision {
	return m.judge(nowNs, src, notUDP)
}

// PacketSeverity accounts for a selected UDP datagram whose <PRI> has
// syslog severity sev (tiers.SyslogSeverity; -1 when it has none) under the
// policy's severity block (docs/design.md §7), as the program does; without one
// it is Packet. It is PacketPRI of facility 0 (kern). The tier comes from N
// as in Packet, then:
//
//   - a SevShedFirst packet is judged at tiers.SeverityTable.ShedDrops[tier]
//     instead of its tier's threshold;
//   - unless the mode is ModeOff, a SevProtected packet whose verdict is a
//     drop passes instead (Protected) while the window's drop debt is under
//     tiers.SeverityTable.ProtectBudget, and adds one to the debt;
//   - unless the mode is ModeOff, any other packet whose verdict is pass is
//     dropped instead (Paid) while the debt is positive, and takes one off.
//
// Opening a window clears the debt.
func (m *Model) PacketSeverity(nowNs uint64, sev int) Decision {
	return m.judge(nowNs, netip.Addr{}, sev)
}

// PacketPRI is PacketSeverity for a datagram whose <PRI> is pri (0..191,
// tiers.SyslogPRI; -1 when it has none): its class is
// tiers.SeverityTable.ClassOfPRI, protected when its facility (pri / 8) is
// protected whatever its severity (pri mod 8).
func (m *Model) PacketPRI(nowNs uint64, pri int) Decision {
	return m.judge(nowNs, netip.Addr{}, pri)
}

// PacketFromSeverity is a UDP datagram from src with syslog severity sev:
// the per-source budget first (PacketFrom), then severity (PacketSeverity).
func (m *Model) PacketFromSeverity(nowNs uint64, src netip.Addr, sev int) Decision {
	return m.judge(nowNs, src, sev)
}

// judge is the whole model: window, source budget, tier, severity. pri is
// notUDP for a packet that severity ignores, -1 for a UDP datagram without
// a valid <PRI>, else its <PRI> (0..191).
func (m *Model) judge(nowNs uint64, src netip.Addr, pri int) Decision {
	severity := m.table.Severity.On && pri != notUDP
	var d Decision
	if !m.open || nowNs > m.start && nowNs-m.start > m.window {
		m.openWindow(nowNs)
		d.WindowOpened = true
	}
	if m.sketch != nil && src.IsValid() {
		over, spent := m.sketch.OverSpentN(m.sources.Group(src), m.opened, m.sources.Budget, uint32(m.w))
		if spent && m.table.Shape == tiers.ShapeSmooth {
			m.exhIn += uint64(m.sources.Budget)
		}
		if over {
			return m.overBudget(nowNs)
		}
	}
	m.count += m.w
	d.N = m.count
	var tier int
	var thr uint32
	if m.table.Shape == tiers.ShapeSmooth {
		tier, thr = m.smooth(nowNs)
	} else {
		tier, thr = m.table.Lookup(d.N)
	}
	d.Tier = tier
	if m.mode == tiers.ModeOff {
		return d
	}
	if severity {
		d.Class = m.table.Severity.ClassOfPRI(pri)
		if d.Class == tiers.SevShedFirst {
			thr = m.table.Severity.ShedDrops[tier]
			if m.table.Shape == tiers.ShapeSmooth {
				thr = m.table.Smoothed.ShedDrops[tier]
			}
		}
	}
	m.lastThr = thr
	d.Pass = ^thr
	drop := m.draw(thr)
	if severity {
		switch {
		case drop && d.Class == tiers.SevProtected && m.debt <= m.table.Severity.ProtectBudget &&
			m.w <= m.table.Severity.ProtectBudget-m.debt:
			drop, d.Protected = false, true
			m.debt += m.w
		case !drop && d.Class != tiers.SevProtected && m.debt > 0:
			drop, d.Paid = true, true
			d.Pass = 0
			m.debt -= min(m.debt, m.w)
		}
	}
	if drop {
		d.Verdict = dropVerdict(m.mode)
	}
	return d
}

// dropVerdict is the verdict of a packet whose judgement is drop under
// mode m: VerdictDrop under ModeEnforce, VerdictWouldDrop under ModeDryRun,
// VerdictPass under ModeOff.
func dropVerdict(m tiers.Mode) tiers.Verdict {
	return [...]tiers.Verdict{tiers.ModeEnforce: tiers.VerdictDrop, tiers.ModeDryRun: tiers.VerdictWouldDrop, tiers.ModeOff: tiers.VerdictPass}[m]
}

// draw is the program's drop decision at threshold thr: 0 never drops and
// AlwaysDrop always does, without a draw; otherwise rand is drawn.
func (m *Model) draw(thr uint32) bool {
	return thr == tiers.AlwaysDrop || thr != 0 && tiers.Dropped(thr, m.rand())
}

// openWindow opens a window at nowNs: the count, the debt and the
// over-budget count restart, and the smooth shape's previous window and
// gap are taken from the window that ends.
func (m *Model) openWindow(nowNs uint64) {
	tick := nowNs / m.tickNs
	m.prev, m.prevEx, m.gap = 0, 0, 0
	if m.open {
		m.prev, m.prevEx = m.count, m.ex
		if end := m.startTick + m.ticks(); tick > end {
			m.gap = tick - end
		}
	}
	m.profPrev, m.prof = m.prof, tiers.SmoothProfile{}
	m.open, m.start, m.count, m.debt, m.ex, m.exhIn = true, nowNs, 0, 0, 0, 0
	m.startTick, m.onset = tick, false
	m.expectIn = tiers.SmoothState{Ticks: m.ticks(), Gap: m.gap, Prev: m.prev}.Coef().Prev
	m.opened++
}

// ticks is the whole ticks in a window, at least 1, as the agent sets the
// program's window_jiffies.
func (m *Model) ticks() uint64 { return max(m.window/m.tickNs, 1) }

// SetTick sets the tick of the smooth estimate, ns: the kernel's jiffy
// (1e9/HZ) where the program has its tick gate, 1 << tiers.SmoothTickShift (the
// default) where it reads the clock.
func (m *Model) SetTick(ns uint64) { m.tickNs = max(ns, 1) }

// smooth judges an in-budget packet of the smooth shape: R̂ and its tier
// and q(R̂). The onset is judged on all selected packets (latch); without
// budgets R̂ is S, or max(S, E) while latched; with budgets it is
// inEstimate.
func (m *Model) smooth(nowNs uint64) (int, uint32) {
	m.refresh(nowNs)
	all := m.count + m.ex
	ea, el := m.latch(nowNs, all)
	// Without budgets every selected packet is in budget: the previous
	// window's over-budget packets (under a policy with budgets before a
	// reload) were offered too, so S takes them (coefTot).
	var rhat uint64
	switch {
	case m.sketch != nil:
		rhat = m.inEstimate(m.count, el)
	case m.latched:
		rhat = max(m.coefTot.Sliding(m.count), ea)
	default:
		rhat = m.coefTot.Sliding(m.count)
	}
	m.lastEstim = rhat
	return m.table.Smooth(rhat + m.fleetIn(rhat))
}

// SetFleetOthers sets the sums of the other fleet members' last reported
// R̂ (docs/design.md §12), packets per window, each at most
// tiers.MaxFleetOthers: in, their in-budget R̂, and total, their R̂ of all
// selected packets (in at most total). The smooth shape judges each
// in-budget packet on R̂_in + in, and with budgets each over-budget packet
// on the share of P(R̂_tot + total) − P(R̂_in + in) (overSmooth), as the
// program does with bpf.Limiter.SetFleetOthers. 0, 0 (the default) is
// the plain smooth shape.
func (m *Model) SetFleetOthers(in, total uint64) {
	m.others = min(total, tiers.MaxFleetOthers)
	m.othersIn = min(in, m.others)
}

// overBudget judges a packet over its group's budget (docs/design.md §6): on
// the capacity in-budget traffic leaves. Ordinal: at position max(n,
// expected in-budget count) + its rank among the window's over-budget
// packets, where the expected in-budget count is the previous window's,
// weighed down by the gap between the two (tiers.SmoothCoef.Prev): in a steady
// state the over-budget packets take the positions after the in-budget
// ones, wherever they arrive in the window; smooth: at the share of the
// passes P(R̂_in + R̂_ex) − P(R̂_in) per over-budget packet
// (tiers.Table.ShareThreshold), computed per tick.
func (m *Model) overBudget(nowNs uint64) Decision {
	d := Decision{OverBudget: true}
	m.ex += m.w
	var thr uint32
	if m.table.Shape == tiers.ShapeSmooth {
		thr = m.overSmooth(nowNs)
	} else {
		_, thr = m.table.Lookup(max(m.count, m.expectIn) + m.ex)
	}
	m.lastThr, d.Pass = thr, ^thr
	if m.mode != tiers.ModeOff && m.draw(thr) {
		d.Verdict = dropVerdict(m.mode)
	}
	return d
}

// overSmooth is the threshold of an over-budget packet under ShapeSmooth,
// judged per packet on the live counts (this one included): the onset
// latched on all selected packets, R̂ of all of them, the in-budget
// expectation max(n, the previous window's, R̂_in in an onset), and the
// share of the passes the in-budget ones leave (tiers.Table.ShareThreshold),
// reused while both estimates stay within 1/1024 of those it was computed
// for.
func (m *Model) overSmooth(nowNs uint64) uint32 {
	m.refresh(nowNs)
	all := m.count + m.ex
	ea, el := m.latch(nowNs, all)
	rtot := m.coefTot.Sliding(all)
	rin := max(m.count, m.coef.Prev)
	if m.latched {
		rtot = max(rtot, ea)
		rin = max(rin, m.inEstimate(m.count, el))
	}
	// The fleet's sums (docs/design.md §12): the others' in-budget R̂
	// joins R̂_in and their total R̂_tot, so that the fleet's
	// over-budget packets share P(R_fleet) − P(R_fleet,in), each member's
	// in proportion to its over-budget load.
	rin, rtot = rin+m.fleetIn(rin), rtot+m.fleetTot(rtot)
	if m.exR == 0 || !near(rtot, m.exR) || !near(rin, m.exRin) {
		m.exR, m.exRin = max(rtot, 1), rin
		m.exThr = m.table.ShareThreshold(rin, rtot)
	}
	return m.exThr
}

// near reports whether a is within b/1024 of b (smooth.h sm_near).
func near(a, b uint64) bool {
	d := max(a, b) - min(a, b)
	return d <= b>>10
}

// mulShift is x × y >> tiers.SmoothFracBits without overflow for any x
// below 2^48, as tiers computes it.
func mulShift(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi<<(64-tiers.SmoothFracBits) | lo>>tiers.SmoothFracBits
}

// Estimate returns R̂ of the latest in-budget packet under ShapeSmooth,
// without the fleet's others (SetFleetOthers). A member reports its live
// R̂_in and R̂_tot (EstimateAt).
func (m *Model) Estimate() uint64 { return m.lastEstim }

// Debt returns the current window's drop debt (PacketSeverity).
func (m *Model) Debt() uint64 { return m.debt }

// N returns the count of the current window: the N of the latest packet,
// or 0 before the first.
func (m *Model) N() uint64 { return m.count }

// SetWindow puts the model in a window that opened at startNs (ns) and has
// counted count packets so far, for tests that start mid-window.
func (m *Model) SetWindow(startNs, count uint64) {
	m.open, m.start, m.count = true, startNs, count
}

// Apply takes table t in place of the model's, as bpf.Limiter.Apply
// writes a new policy slot under a running program: the window, its
// count and debt, and the smooth shape's estimate stay; the memos of the
// old table's thresholds are dropped. The license's pacing (docs/design.md
// §13) applies a new max each window this way.
func (m *Model) Apply(t tiers.Table) {
	m.table, m.sources = t, t.Sources
	m.exR, m.lastThr = 0, 0
}
