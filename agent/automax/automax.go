// Package automax is the adaptive max's controller (docs/design.md §8): it
// reads the collector sockets' receive-buffer drops (DropSource: sock_diag,
// or /proc/net/snmp) in the collector's network namespace, judges each
// window by the law of tiers/autolaw.go, and applies the new max through
// the func the agent gives it. It knows nothing of the agent. Linux only.
package automax

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sysutil"
	"github.com/tierlimit/tierlimit/tiers"
)

// Window is one judged window of the adaptive max, for logs, tests and
// `tierlimit demo --auto`. Counts are packets.
type Window struct {
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

// Limiter is what the controller reads of the limiter: *bpf.Limiter.
type Limiter interface {
	Stats() (bpf.Stats, error)
	Window() (bpf.Window, error)
}

// Controller is the adaptive-max controller of an Agent (docs/design.md §8).
type Controller struct {
	log   *slog.Logger
	lim   Limiter
	clock sysutil.Clock
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
	primed  bool      // the baselines below are set
	opened  uint64    // windows_opened_total at the last judgement
	stats   bpf.Stats // at the last judgement
	missing bool      // no collector socket was there at the last judgement
	lastErr string    // the last read error logged
	history []Window  // the last autoHistory judgements

	up, down, socketDrops atomic.Uint64
}

// autoHistory is how many judged windows History keeps.
const autoHistory = 512

// New makes the controller of policy p, reading lim and the collector
// socket drops from src, on clock c. mu serialises its judgements with
// the agent's reloads; apply applies a policy with mu held.
func New(log *slog.Logger, lim Limiter, src DropSource, c sysutil.Clock, mu sync.Locker, apply func(tiers.Policy) error, p tiers.Policy) *Controller {
	m := &Controller{log: log, lim: lim, src: src, clock: c, mu: mu, apply: apply, base: p.Clone()}
	if p.Auto != nil {
		m.law = tiers.NewAutoLaw(*p.Auto, p.Max)
		m.netns = p.Auto.NetNS
	}
	return m
}

// Start logs the controller's signal and law, under `max: auto` (a fixed
// max logs nothing: the controller only follows reloads, and logs them
// when one turns `max: auto` on), and runs it until ctx ends or stop says
// so, then closes its signal.
func (m *Controller) Start(ctx context.Context, stop func() bool) {
	if m.base.Auto != nil {
		m.logSignal()
	}
	go func() {
		defer m.closeSource()
		m.run(ctx, stop)
	}()
}

// logSignal logs the signal the controller reads and its law.
func (m *Controller) logSignal() {
	m.log.Info("adaptive max: collector socket drops", "signal", m.src.Signal(), "netns", netnsName(m.netns), "ports", portsString(udpPorts(m.base)),
		"law", tiers.AutoLawSummary())
	if s, ok := m.src.(*snmp); ok && s.why != nil {
		m.log.Warn("adaptive max: no per-socket drops, using the namespace's UDP RcvbufErrors", "reason", s.why)
	}
}

// SourceFor opens the signal in p's auto.netns when the controller reads
// another namespace now (the agent's mu held); nil when it stays, or when
// no controller runs (m nil). "" is the agent's own namespace, own.
func (m *Controller) SourceFor(p tiers.Policy, own netns.NsHandle) (DropSource, error) {
	if m == nil || p.Auto == nil || p.Auto.NetNS == m.netns {
		return nil, nil
	}
	if p.Auto.NetNS != "" {
		return OpenDropSourceIn(p.Auto.NetNS)
	}
	var src DropSource
	err := sysutil.OnThreadIn(own, "the agent's network namespace", func() (err error) {
		src, err = OpenDropSource(false)
		return err
	})
	return src, err
}

// Counts are the controller's counters (docs/design.md §5): the changes of
// max by direction, and the collector sockets' receive-buffer drops seen.
func (m *Controller) Counts() (up, down, socketDrops uint64) {
	return m.up.Load(), m.down.Load(), m.socketDrops.Load()
}

// netnsName is how the log names auto.netns.
func netnsName(path string) string {
	if path == "" {
		return "the agent's"
	}
	return path
}

// closeSource closes the signal once run has ended.
func (m *Controller) closeSource() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.src.Close()
}

// ReloadPolicy is the policy a reload applies in place of p (the agent's
// mu held): with the learnt max when p's auto bounds equal those in force.
// p itself when no controller runs (m nil).
func (m *Controller) ReloadPolicy(p tiers.Policy) tiers.Policy {
	if m == nil {
		return p
	}
	if p.Auto != nil && m.base.Auto != nil && *p.Auto == *m.base.Auto {
		return p.WithMax(m.law.Max())
	}
	return p
}

// Reloaded tells the controller that a reload applied p (the agent's mu
// held), with src, the signal SourceFor opened for it, or nil. With no
// controller (m nil) it closes src.
func (m *Controller) Reloaded(p tiers.Policy, src DropSource) {
	if m == nil {
		if src != nil {
			src.Close()
		}
		return
	}
	keep := p.Auto != nil && m.base.Auto != nil && *p.Auto == *m.base.Auto
	turnedOn := p.Auto != nil && m.base.Auto == nil
	m.base = p.Clone()
	if src != nil {
		if m.closed {
			src.Close()
		} else {
			m.src.Close()
			m.src, m.netns = src, p.Auto.NetNS
			m.logSignal()
		}
	} else if turnedOn && !m.closed {
		m.logSignal()
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
func (m *Controller) Max() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.base.Max
}

// Signal names the drop signal: SignalSockDiag or SignalSNMP.
func (m *Controller) Signal() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.src.Signal()
}

// History returns the last judged windows, oldest first.
func (m *Controller) History() []Window {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Window(nil), m.history...)
}

// autoPolls is how many times per window length the controller looks for
// a new window: the judged counts are off from the limiter's window by at
// most window/autoPolls, while the first tier passes its packets at the
// window's start, at the offered rate.
const autoPolls = 32

// run judges each window until ctx ends or stop says so.
func (m *Controller) run(ctx context.Context, stop func() bool) {
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
func (m *Controller) tick() {
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
	if st := tiers.WindowNow(m.clock.Now(), w.Counts(), tiers.WindowPolicy{Window: m.base.Window}); st.Elapsed > 0 && st.Elapsed < m.base.Window/2 {
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
	rec := Window{Window: w.Opened, Offered: s.Delivered + s.Shed, Delivered: s.Delivered, Shed: s.Shed,
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

func (m *Controller) readError(err error) {
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
