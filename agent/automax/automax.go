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
	clock clock
	// mu serialises judgements with reloads (the Agent's mu); apply
	// compiles and applies a policy with mu held.
	mu    sync.Locker
	apply func(tiers.Policy) error

	// Guarded by mu.
	src     DropSource   // the signal, read in the namespace netns names
	netns   string       // auto.netns that src was opened for: "" is the agent's own
	closed  bool         // run has ended and closed src
	base    tiers.Policy // the policy in force; Max is the learnt max when Auto != nil
	law     tiers.AutoLaw
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
		m.law = tiers.NewAutoLaw(*p.Auto, p.Max)
		m.netns = p.Auto.NetNS
	}
	return m
}

// StartAutoMax starts the adaptive-max controller for policy p, the policy
// New or the last Reload applied, reading collector socket drops from src,
// which OpenDropSourceIn opened in p's auto.netns (the agent's network
// namespace when p has none). It runs until ctx ends or the agent closes,
// then closes src. While the policy has no `max: auto` it only follows
// reloads; Reload keeps the learnt max when the auto settings stay the
// same, and opens the signal again when auto.netns changes (a namespace
// where it cannot be read refuses the reload). Returns an error when a
// controller runs already.
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
	a.log.Info("adaptive max: collector socket drops", "signal", src.Signal(), "netns", netnsName(m.netns), "ports", portsString(udpPorts(p)),
		"law", fmt.Sprintf("drops: max×max(%.1f, 1-drops/delivered), at most ×%.1f from a buffer over half full; %d clean windows while shedding: max+step (start/%d, doubling beyond 10%% over the last max with drops, up to ×%d)",
			tiers.AutoBeta, tiers.AutoBetaFirst, tiers.AutoK, tiers.AutoAlphaDiv, tiers.AutoAlphaCap))
	if s, ok := src.(*snmp); ok && s.why != nil {
		a.log.Warn("adaptive max: no per-socket drops, using the namespace's UDP RcvbufErrors", "reason", s.why)
	}
	go func() {
		defer m.closeSource()
		m.run(ctx, a.closed.Load)
	}()
	return m, nil
}

// applyLocked compiles p, its dests local resolved (withLocal), and
// applies it; a.applyMu is held.
func (a *Agent) applyLocked(p tiers.Policy) error {
	rp := p.WithLocal(a.local)
	tab, err := tiers.Compile(rp)
	if err != nil {
		return err
	}
	if err := a.lim.Apply(rp, tab); err != nil {
		return err
	}
	a.current = p
	if ep := a.record.Load(); ep != nil {
		ep.setMax(p.Max)
	}
	return nil
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

// autoApplied tells the controller that a reload applied p (a.applyMu
// held), with src, the signal autoSource opened for it, or nil.
func (a *Agent) autoApplied(p tiers.Policy, src DropSource) {
	if m := a.auto.Load(); m != nil {
		m.reloaded(p, src)
	} else if src != nil {
		src.Close()
	}
}

// autoSource opens the signal in p's auto.netns when the controller reads
// another namespace now (a.applyMu held); nil when it stays. "" is the
// agent's own namespace.
func (a *Agent) autoSource(p tiers.Policy) (DropSource, error) {
	m := a.auto.Load()
	if m == nil || p.Auto == nil || p.Auto.NetNS == m.netns {
		return nil, nil
	}
	if p.Auto.NetNS != "" {
		return OpenDropSourceIn(p.Auto.NetNS)
	}
	var src DropSource
	err := a.inNS(func() (err error) {
		src, err = OpenDropSource(false)
		return err
	})
	return src, err
}

// netnsName is how the log names auto.netns.
func netnsName(path string) string {
	if path == "" {
		return "the agent's"
	}
	return path
}

// closeSource closes the signal once run has ended.
func (m *AutoMax) closeSource() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.src.Close()
}

func (m *AutoMax) reloadPolicy(p tiers.Policy) tiers.Policy {
	if p.Auto != nil && m.base.Auto != nil && *p.Auto == *m.base.Auto {
		return p.WithMax(m.law.Max())
	}
	return p
}

func (m *AutoMax) reloaded(p tiers.Policy, src DropSource) {
	keep := p.Auto != nil && m.base.Auto != nil && *p.Auto == *m.base.Auto
	m.base = p.Clone()
	if src != nil {
		if m.closed {
			src.Close()
		} else {
			m.src.Close()
			m.src, m.netns = src, p.Auto.NetNS
			m.log.Info("adaptive max: collector socket drops", "signal", src.Signal(), "netns", netnsName(m.netns))
		}
	}
	switch {
	case keep:
		m.log.Info("adaptive max: reload keeps the learnt max", "max", p.Max, "auto", p.Auto.String())
	case p.Auto != nil:
		m.law, m.primed = tiers.NewAutoLaw(*p.Auto, p.Max), false
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
func (m *AutoMax) Signal() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.src.Signal()
}

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
		SocketDrops: ds.Drops, Sockets: ds.Sockets, Full: ds.Full, Max: m.law.Max()}
	defer func() { m.history = append(m.history[max(0, len(m.history)+1-autoHistory):], rec) }()

	if ds.Sockets == 0 {
		if !m.missing {
			m.log.Warn("adaptive max: no collector socket on the selected UDP ports; max held until one appears",
				"ports", portsString(udpPorts(m.base)), "max", m.law.Max())
		}
		m.missing = true
		m.law.Hold()
		return
	}
	if m.missing {
		m.log.Info("adaptive max: collector socket found", "sockets", ds.Sockets, "max", m.law.Max())
		m.missing = false
	}
	old := m.law
	nm, cause := m.law.Judge(s)
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
	if nm < old.Max() {
		rec.Change = "down"
		m.down.Add(1)
	} else {
		m.up.Add(1)
	}
	m.log.Info("adaptive max", "direction", rec.Change, "from", old.Max(), "to", nm, "cause", cause)
}

func (m *AutoMax) readError(err error) {
	if msg := err.Error(); msg != m.lastErr {
		m.lastErr = msg
		m.log.Warn("adaptive max: read failed; max held", "error", err)
	}
}

// delta is the window's counts between two Stats.
func delta(now, before bpf.Stats) tiers.AutoSample {
	var s tiers.AutoSample
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
