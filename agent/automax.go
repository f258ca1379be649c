package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// The control law of `max: auto` (DESIGN.md §8), judged once per limiter
// window on that window's counts:
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
//     windows, in the same way; TCP Reno always cuts by half). The window right after
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
	// autoFull is the receive-buffer fill above which a window without
	// drops does not count as clean: the collector is behind, and the
	// buffer that hides it is about to overflow.
	autoFull = 0.5
	// autoNear is how close to the last max that saw drops the step stays
	// Alpha: within max/autoNear (10%).
	autoNear = 10
)

// autoLaw is the control law's state, pure: fed one window's counts, it
// returns the new max. All counts are packets.
type autoLaw struct {
	bounds tiers.AutoMax
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

func newAutoLaw(b tiers.AutoMax, m uint64) autoLaw {
	return autoLaw{bounds: b, max: m, step: autoAlpha(b), full: 1}
}

// autoAlpha is the additive step near the last max with drops: start/AutoAlphaDiv, at least 1.
func autoAlpha(b tiers.AutoMax) uint64 { return max(1, b.Start/AutoAlphaDiv) }

// autoSample is one judged window.
type autoSample struct {
	Delivered uint64  // selected packets passed to the host (pass + would_drop)
	Shed      uint64  // selected packets dropped or would_drop
	Drops     uint64  // collector socket receive-buffer drops
	Full      float64 // the collector's receive buffer fill, 0..1, mid-window
}

// judge applies the law to window s. It returns the new max and why it
// changed ("" when it did not).
func (l *autoLaw) judge(s autoSample) (uint64, string) {
	ratio := 1.0 // of the socket drops to what was delivered
	if s.Delivered > 0 {
		ratio = min(1, float64(s.Drops)/float64(s.Delivered))
	}
	full := l.full
	l.full = s.Full
	growing := s.Shed > 0 && s.Full > autoFull && s.Full-full >= AutoRise
	switch {
	case (s.Drops > 0 || growing) && l.cut:
		l.clean, l.cut, l.ratio = 0, false, ratio
		return l.max, ""
	case s.Drops > 0:
		beta := AutoBetaFirst
		if l.ratio >= 1-AutoBeta {
			beta = AutoBeta
		}
		l.ratio = ratio
		return l.cutTo(max(beta, 1-ratio),
			fmt.Sprintf("%d collector socket drops of %d packets delivered in the last window", s.Drops, s.Delivered))
	case growing:
		l.ratio = 0
		return l.cutTo(AutoBetaFirst,
			fmt.Sprintf("the collector's receive buffer grew from %.0f%% to %.0f%% full in the last window, without socket drops yet", 100*full, 100*s.Full))
	case s.Shed == 0 || s.Full > autoFull:
		l.clean, l.cut, l.ratio = 0, false, 0
		return l.max, ""
	}
	l.cut, l.ratio = false, 0
	l.clean++
	probing := l.peak == 0 || l.max > l.peak+l.peak/autoNear
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
		l.step = min(2*l.step, AutoAlphaCap*autoAlpha(l.bounds))
	}
	l.max = m
	return m, fmt.Sprintf("%d windows without collector socket drops while shedding", k)
}

// cutTo multiplies max by f (at least one packet lower, not below floor)
// and records the cut: the next window is not cut again, and the step up
// starts again at Alpha below the max that was cut.
func (l *autoLaw) cutTo(f float64, cause string) (uint64, string) {
	l.clean, l.cut = 0, true
	m := uint64(float64(l.max) * f)
	if m >= l.max {
		m = l.max - 1
	}
	m = max(m, l.bounds.Floor)
	l.peak, l.step = l.max, autoAlpha(l.bounds)
	if m == l.max {
		return m, ""
	}
	l.max = m
	return m, cause
}

// AutoWindow is one judged window of the adaptive max, for logs, tests and
// `tierlimit demo --auto`. Counts are packets.
type AutoWindow struct {
	// Window is windows_opened_total when the window was judged.
	Window uint64
	// Offered are the selected packets counted; Delivered those passed to
	// the host (pass and would_drop); Shed those dropped or would_drop.
	Offered, Delivered, Shed uint64
	// SocketDrops are the collector sockets' receive-buffer drops, and
	// Sockets how many collector sockets there were.
	SocketDrops uint64
	Sockets     int
	// Full is the fullest collector socket's receive-buffer fill, 0..1.
	Full float64
	// Max is the max after the judgement; Change is "up", "down" or "".
	Max    uint64
	Change string
}

// clock is what the controller needs of time; tests pass a fake.
type clock interface {
	After(d time.Duration) <-chan time.Time
	// Now is CLOCK_MONOTONIC in ns, the clock of bpf.Window.StartNs.
	Now() uint64
}

type realClock struct{}

func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func (realClock) Now() uint64 {
	t, _ := monotonic()
	return t
}

// limiterReader is what the controller reads of the limiter.
type limiterReader interface {
	Stats() (bpf.Stats, error)
	Window() (bpf.Window, error)
}

// AutoMax is the adaptive-max controller of an Agent (DESIGN.md §8).
type AutoMax struct {
	log   *slog.Logger
	lim   limiterReader
	src   DropSource
	clock clock
	// mu serialises judgements with reloads (the Agent's mu); apply
	// compiles and applies a policy with mu held.
	mu    sync.Locker
	apply func(tiers.Policy) error

	// Guarded by mu.
	base    tiers.Policy // the policy in force; Max is the learnt max when Auto != nil
	law     autoLaw
	primed  bool         // the baselines below are set
	opened  uint64       // windows_opened_total at the last judgement
	stats   bpf.Stats    // at the last judgement
	missing bool         // no collector socket was there at the last judgement
	lastErr string       // the last read error logged
	history []AutoWindow // the last autoHistory judgements

	up, down, socketDrops atomic.Uint64
}

// autoHistory is how many judged windows History keeps.
const autoHistory = 512

func newAutoMax(log *slog.Logger, lim limiterReader, src DropSource, c clock, mu sync.Locker, apply func(tiers.Policy) error, p tiers.Policy) *AutoMax {
	m := &AutoMax{log: log, lim: lim, src: src, clock: c, mu: mu, apply: apply, base: p.Clone()}
	if p.Auto != nil {
		m.law = newAutoLaw(*p.Auto, p.Max)
	}
	return m
}

// StartAutoMax starts the adaptive-max controller for policy p, the policy
// New or the last Reload applied, reading collector socket drops from src
// (OpenDropSource, opened in the agent's network namespace). It runs until
// ctx ends or the agent closes, then closes src. While the policy has no
// `max: auto` it only follows reloads; Reload keeps the learnt max when the
// auto bounds stay the same. Returns an error when a controller runs already.
func (a *Agent) StartAutoMax(ctx context.Context, p tiers.Policy, src DropSource) (*AutoMax, error) {
	apply := func(p tiers.Policy) error {
		if a.closed.Load() {
			return errors.New("agent closed")
		}
		return a.applyLocked(p)
	}
	m := newAutoMax(a.log, a.lim, src, realClock{}, &a.applyMu, apply, p)
	if !a.auto.CompareAndSwap(nil, m) {
		return nil, fmt.Errorf("adaptive max: a controller runs already")
	}
	a.log.Info("adaptive max: collector socket drops", "signal", src.Signal(), "ports", portsString(udpPorts(p)),
		"law", fmt.Sprintf("drops: max×max(%.1f, 1-drops/delivered); %d clean windows while shedding: max+step (start/%d, doubling beyond 10%% over the last max with drops, up to ×%d)",
			AutoBeta, AutoK, AutoAlphaDiv, AutoAlphaCap))
	if s, ok := src.(*snmp); ok && s.why != nil {
		a.log.Warn("adaptive max: no per-socket drops, using the namespace's UDP RcvbufErrors", "reason", s.why)
	}
	go func() {
		defer src.Close()
		m.run(ctx, a.closed.Load)
	}()
	return m, nil
}

// applyLocked compiles p and applies it; a.applyMu is held.
func (a *Agent) applyLocked(p tiers.Policy) error {
	tab, err := tiers.Compile(p)
	if err != nil {
		return err
	}
	return a.lim.Apply(p, tab)
}

// AutoMax returns the adaptive-max controller, or nil when none runs.
func (a *Agent) AutoMax() *AutoMax { return a.auto.Load() }

// autoPolicy is the policy a reload applies in place of p (a.applyMu held):
// with the learnt max when p's auto bounds equal those in force.
func (a *Agent) autoPolicy(p tiers.Policy) tiers.Policy {
	if m := a.auto.Load(); m != nil {
		return m.reloadPolicy(p)
	}
	return p
}

// autoApplied tells the controller that a reload applied p (a.applyMu held).
func (a *Agent) autoApplied(p tiers.Policy) {
	if m := a.auto.Load(); m != nil {
		m.reloaded(p)
	}
}

func (m *AutoMax) reloadPolicy(p tiers.Policy) tiers.Policy {
	if p.Auto != nil && m.base.Auto != nil && *p.Auto == *m.base.Auto {
		return p.WithMax(m.law.max)
	}
	return p
}

func (m *AutoMax) reloaded(p tiers.Policy) {
	keep := p.Auto != nil && m.base.Auto != nil && *p.Auto == *m.base.Auto
	m.base = p.Clone()
	switch {
	case keep:
		m.log.Info("adaptive max: reload keeps the learnt max", "max", p.Max, "auto", p.Auto.String())
	case p.Auto != nil:
		m.law, m.primed = newAutoLaw(*p.Auto, p.Max), false
		m.log.Info("adaptive max: new auto settings, max starts again", "max", p.Max, "auto", p.Auto.String())
	default:
		m.primed = false
	}
}

// Max returns the max in force, packets per window.
func (m *AutoMax) Max() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.base.Max
}

// Signal names the drop signal: SignalSockDiag or SignalSNMP.
func (m *AutoMax) Signal() string { return m.src.Signal() }

// History returns the last judged windows, oldest first.
func (m *AutoMax) History() []AutoWindow {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]AutoWindow(nil), m.history...)
}

// autoPolls is how many times per window length the controller looks for
// a new window: the judged counts are off from the limiter's window by at
// most window/autoPolls, while the first tier passes its packets at the
// window's start, at the offered rate.
const autoPolls = 32

// run judges each window until ctx ends or stop says so.
func (m *AutoMax) run(ctx context.Context, stop func() bool) {
	for {
		m.mu.Lock()
		w := m.base.Window
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-m.clock.After(max(time.Millisecond, w/autoPolls)):
		}
		if stop() {
			return
		}
		m.tick()
	}
}

// tick judges the window that ended, if one did since the last tick.
func (m *AutoMax) tick() {
	w, err := m.lim.Window()
	if err != nil {
		m.readError(err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.base.Auto == nil || m.primed && w.Opened == m.opened {
		return
	}
	// Judge in the middle of the new window: the first tier passes its
	// packets, and the socket overflows, at a window's start, so a sample
	// from middle to middle holds each window's burst whole, however late
	// the scheduler runs this tick.
	if now := m.clock.Now(); now > w.StartNs && now-w.StartNs < uint64(m.base.Window/2) {
		return
	}
	st, err := m.lim.Stats()
	if err != nil {
		m.readError(err)
		return
	}
	ds, err := m.src.Read(udpPorts(m.base))
	if err != nil {
		m.readError(err)
		return
	}
	if !m.primed {
		m.opened, m.stats, m.primed = w.Opened, st, true
		return
	}
	m.lastErr = ""
	m.socketDrops.Add(ds.Drops)
	s := delta(st, m.stats)
	s.Drops, s.Full = ds.Drops, ds.Full
	m.opened, m.stats = w.Opened, st
	rec := AutoWindow{Window: w.Opened, Offered: s.Delivered + s.Shed, Delivered: s.Delivered, Shed: s.Shed,
		SocketDrops: ds.Drops, Sockets: ds.Sockets, Full: ds.Full, Max: m.law.max}
	defer func() { m.history = append(m.history[max(0, len(m.history)+1-autoHistory):], rec) }()

	if ds.Sockets == 0 {
		if !m.missing {
			m.log.Warn("adaptive max: no collector socket on the selected UDP ports; max held until one appears",
				"ports", portsString(udpPorts(m.base)), "max", m.law.max)
		}
		m.missing, m.law.clean, m.law.full = true, 0, 1
		return
	}
	if m.missing {
		m.log.Info("adaptive max: collector socket found", "sockets", ds.Sockets, "max", m.law.max)
		m.missing = false
	}
	old := m.law
	nm, cause := m.law.judge(s)
	if cause == "" {
		return
	}
	if err := m.apply(m.base.WithMax(nm)); err != nil {
		m.law = old
		m.log.Error("adaptive max: applying the new max failed; the old one stays", "max", nm, "error", err)
		return
	}
	m.base.Max, rec.Max = nm, nm
	rec.Change = "up"
	if nm < old.max {
		rec.Change = "down"
		m.down.Add(1)
	} else {
		m.up.Add(1)
	}
	m.log.Info("adaptive max", "direction", rec.Change, "from", old.max, "to", nm, "cause", cause)
}

func (m *AutoMax) readError(err error) {
	if msg := err.Error(); msg != m.lastErr {
		m.lastErr = msg
		m.log.Warn("adaptive max: read failed; max held", "error", err)
	}
}

// delta is the window's counts between two Stats.
func delta(now, before bpf.Stats) autoSample {
	var s autoSample
	pass := now.SelectedTotal(tiers.VerdictPass).Packets - before.SelectedTotal(tiers.VerdictPass).Packets
	drop := now.SelectedTotal(tiers.VerdictDrop).Packets - before.SelectedTotal(tiers.VerdictDrop).Packets
	would := now.SelectedTotal(tiers.VerdictWouldDrop).Packets - before.SelectedTotal(tiers.VerdictWouldDrop).Packets
	s.Delivered, s.Shed = pass+would, drop+would
	return s
}

func portsString(ports []tiers.PortRange) string {
	return "udp/" + tiers.Rule{Ports: ports}.PortsString()
}

// The metrics of the adaptive max (DESIGN.md §5, §8), emitted while a
// controller runs.
var (
	autoAdjustDesc = metric("auto_max_adjustments_total", "Changes of the adaptive max (max: auto), by direction (up, down).", "direction")
	autoDropsDesc  = metric("collector_socket_drops_total", "Receive-buffer drops of the collector's UDP sockets (the selected ports) seen by the adaptive max.")
)

// autoCounts returns the controller's counters, nil when none runs.
func (a *Agent) autoCounts() *AutoCounts {
	m := a.auto.Load()
	if m == nil {
		return nil
	}
	return &AutoCounts{Up: m.up.Load(), Down: m.down.Load(), SocketDrops: m.socketDrops.Load()}
}

// collectAuto emits the adaptive max's families of snapshot s.
func collectAuto(ch chan<- prometheus.Metric, s Snapshot) {
	if s.Auto == nil {
		return
	}
	counter(ch, autoAdjustDesc, s.Auto.Up, "up")
	counter(ch, autoAdjustDesc, s.Auto.Down, "down")
	counter(ch, autoDropsDesc, s.Auto.SocketDrops)
}
