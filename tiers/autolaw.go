package tiers

import "fmt"

// The control law of `max: auto` (docs/design.md §8), judged once per limiter
// window on that window's counts. It is pure: numbers in, the new max out;
// the agent's controller reads the signal and applies what it returns, and
// `tierlimit check` prints these constants.
//
//   - Socket drops D while the limiter delivered P selected packets (pass
//     and would_drop): max ← max × max(Beta, 1 − D/P), at least one packet
//     lower, never below floor. With the tiers fixed, what the limiter
//     passes grows in proportion to max, so 1 − D/P is the max at which
//     the collector would have taken all it was given. Beta bounds the cut
//     in one window: Beta (30%) when the window before also dropped more
//     than 30% of what was delivered, so a flood far above capacity
//     converges geometrically, and BetaFirst (10%) otherwise: drops after
//     a clean window, or mild drops near capacity, may be the excess of
//     several windows that a large socket buffer held before it
//     overflowed, or a collector that stalled for a moment (DCTCP cuts in proportion to congestion, smoothed over
//     windows, in the same way; TCP Reno always cuts by half). Drops
//     while the receive buffer is over AutoFull mid-window come from a
//     standing backlog: there the cut is at least BetaFirst, since
//     1 − D/P would give the collector exactly what it reads and the
//     backlog, with its drops, would stand (the smooth shape of §9
//     delivers at a steady rate, so nothing drains it between bursts).
//     The window right after
//     a cut is not cut again: its drops may still come from the backlog
//     that the old max left in the socket buffer (TCP cuts once per round
//     trip for the same reason).
//   - No socket drops, but a collector socket's receive buffer more than
//     half full in the middle of the window and at least AutoRise fuller
//     than in the window before, while the limiter shed: max ← max ×
//     BetaFirst, with the same bounds and the same one window's pause
//     after a cut. The backlog grows only while the collector is given
//     more than it reads, so max is over its capacity already; waiting
//     for the drops would cut later, from a full buffer, and lose the
//     packets that the buffer can no longer hold (RED and ECN mark a
//     growing queue before it overflows for the same reason). A buffer
//     that is full but draining is the collector catching up: no cut.
//     sock_diag only: /proc/net/snmp tells no fill.
//   - K consecutive windows without socket drops while the limiter shed
//     (drop or would_drop): max ← max + step, never above ceiling. Up to
//     10% over the last max that saw drops, where the collector choked
//     before, step is Alpha = start/AlphaDiv: a step there costs at most
//     ~1% of a start-sized offered load in socket drops. Further up the
//     collector has grown: one clean window is enough, and step doubles
//     with each increase up to AlphaCap × Alpha, so max climbs from a
//     quarter to the whole of start in about ten windows (CUBIC's shape:
//     slow near the last loss, fast away from it). A cut resets step to
//     Alpha.
//   - No change while the limiter sheds nothing: then max does not
//     matter, and a window without shedding says nothing about capacity.
//     Nor while a collector socket's receive buffer is more than half full
//     in the middle of the window (sock_diag only): the collector is
//     behind, and the buffer hides its drops for a few windows more.
//
// At most one change per window: a window is judged only once the limiter
// has opened the next one (windows_opened_total moved) and that one is half
// over, and the judgement applies at most one change.
const (
	AutoBeta      = 0.7
	AutoBetaFirst = 0.9
	AutoK         = 2
	AutoAlphaDiv  = 100
	AutoAlphaCap  = 16
	// AutoRise is the growth of the receive-buffer fill (ratio 0..1 of the
	// buffer), from one judged window to the next, from which a buffer over
	// half full counts as a growing backlog: 2%, over the usual jitter of the
	// fill of a steady backlog sampled at the same point of each window
	// (mostly under 1% in TestAutoMaxSlowCollector's trajectories; a
	// rarer jump costs one 10% cut, which the steps up then win back).
	AutoRise = 0.02
	// AutoFull is the receive-buffer fill above which a window without
	// drops does not count as clean: the collector is behind, and the
	// buffer that hides it is about to overflow.
	AutoFull = 0.5
	// AutoNear is how close to the last max that saw drops the step stays
	// Alpha: within max/AutoNear (10%).
	AutoNear = 10
)

// AutoLaw is the control law's state, pure: fed one window's counts, it
// returns the new max. All counts are packets.
type AutoLaw struct {
	bounds AutoMax
	max    uint64
	step   uint64
	peak   uint64  // max at the last cut; 0 before any
	clean  int     // consecutive clean windows while shedding
	cut    bool    // the last window judged cut max
	ratio  float64 // socket drops over delivered in the last window judged
	// full is the receive-buffer fill in the last window judged; 1 (full)
	// when there is none, so that a first fill is never growth.
	full float64
}

// NewAutoLaw starts the law within bounds b at max m.
func NewAutoLaw(b AutoMax, m uint64) AutoLaw {
	return AutoLaw{bounds: b, max: m, step: AutoAlpha(b), full: 1}
}

// Max is the max the law last returned, packets per window.
func (l *AutoLaw) Max() uint64 { return l.max }

// Hold forgets the clean windows and the buffer fill seen so far: no
// collector socket was there to judge a window by.
func (l *AutoLaw) Hold() { l.clean, l.full = 0, 1 }

// AutoAlpha is the additive step near the last max with drops: start/AutoAlphaDiv, at least 1.
func AutoAlpha(b AutoMax) uint64 { return max(1, b.Start/AutoAlphaDiv) }

// AutoSample is one judged window.
type AutoSample struct {
	Delivered uint64  // selected packets passed to the host (pass + would_drop)
	Shed      uint64  // selected packets dropped or would_drop
	Drops     uint64  // collector socket receive-buffer drops
	Full      float64 // the collector's receive buffer fill, 0..1, mid-window
}

// Judge applies the law to window s. It returns the new max and why it
// changed ("" when it did not).
func (l *AutoLaw) Judge(s AutoSample) (uint64, string) {
	ratio := 1.0 // of the socket drops to what was delivered
	if s.Delivered > 0 {
		ratio = min(1, float64(s.Drops)/float64(s.Delivered))
	}
	full := l.full
	l.full = s.Full
	growing := s.Shed > 0 && s.Full > AutoFull && s.Full-full >= AutoRise
	switch {
	case (s.Drops > 0 || growing) && l.cut:
		l.clean, l.cut, l.ratio = 0, false, ratio
		return l.max, ""
	case s.Drops > 0:
		beta := AutoBetaFirst
		if l.ratio >= 1-AutoBeta {
			beta = AutoBeta
		}
		f := max(beta, 1-ratio)
		if s.Full > AutoFull {
			// A standing backlog: 1 − D/P would give the collector just
			// what it reads, and the backlog would never drain.
			f = min(f, AutoBetaFirst)
		}
		l.ratio = ratio
		return l.cutTo(f,
			fmt.Sprintf("%d collector socket drops of %d packets delivered in the last window", s.Drops, s.Delivered))
	case growing:
		l.ratio = 0
		return l.cutTo(AutoBetaFirst,
			fmt.Sprintf("the collector's receive buffer grew from %.0f%% to %.0f%% full in the last window, without socket drops yet", 100*full, 100*s.Full))
	case s.Shed == 0 || s.Full > AutoFull:
		l.clean, l.cut, l.ratio = 0, false, 0
		return l.max, ""
	}
	l.cut, l.ratio = false, 0
	l.clean++
	probing := l.peak == 0 || l.max > l.peak+l.peak/AutoNear
	k := AutoK
	if probing {
		k = 1
	}
	if l.clean < k {
		return l.max, ""
	}
	l.clean = 0
	m := min(l.bounds.Ceiling, l.max+l.step)
	if m == l.max {
		return m, ""
	}
	if probing {
		l.step = min(2*l.step, AutoAlphaCap*AutoAlpha(l.bounds))
	}
	l.max = m
	return m, fmt.Sprintf("%d windows without collector socket drops while shedding", k)
}

// cutTo multiplies max by f (at least one packet lower, not below floor)
// and records the cut: the next window is not cut again, and the step up
// starts again at Alpha below the max that was cut.
func (l *AutoLaw) cutTo(f float64, cause string) (uint64, string) {
	l.clean, l.cut = 0, true
	m := uint64(float64(l.max) * f)
	if m >= l.max {
		m = l.max - 1
	}
	m = max(m, l.bounds.Floor)
	l.peak, l.step = l.max, AutoAlpha(l.bounds)
	if m == l.max {
		return m, ""
	}
	l.max = m
	return m, cause
}
