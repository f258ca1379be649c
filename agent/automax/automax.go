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
	// applies the policy in force again, with mu held, at the law's max
	// (Learnt).
	mu    sync.Locker
	apply func() error

	// Guarded by mu.
	src     DropSource // the signal, read in the namespace netns names
	netns   string     // auto.netns that src was opened for: "" is the agent's own
	closed  bool       // run has ended and closed src
	policy  policyPart // what it takes of the policy in force (New, Reloaded)
	law     tiers.AutoLaw
	primed  bool      // the baselines below are set
	opened  uint64    // windows_opened_total at the last judgement
	stats   bpf.Stats // at the last judgement
	missing bool      // no collector socket was there at the last judgement
	lastErr string    // the last read error logged
	history []Window  // the last autoHistory judgements

	up, down, socketDrops atomic.Uint64
}

// policyPart is what the controller takes of the policy in force: the
// agent holds the policy, and hands it over at New and Reloaded.
type policyPart struct {
	auto   *tiers.AutoMax    // the auto bounds; nil without max: auto
	max    uint64            // the policy's max (under max: auto, the law's start)
	window time.Duration     // the window length
	ports  []tiers.PortRange // the selected UDP ports, whose sockets' drops are read
}

// partOf is what the controller takes of p.
func partOf(p tiers.Policy) policyPart {
	var auto *tiers.AutoMax
	if p.Auto != nil {
		a := *p.Auto
		auto = &a
	}
	return policyPart{auto: auto, max: p.Max, window: p.Window, ports: udpPorts(p)}
}

// autoHistory is how many judged windows History keeps.
const autoHistory = 512

// New makes the controller of policy p, the policy in force, reading lim
// and the collector socket drops from src, on clock c. mu serialises its
// judgements with the agent's reloads; apply applies the policy in force
// again, with mu held, at the max the law learnt (Learnt).
func New(log *slog.Logger, lim Limiter, src DropSource, c sysutil.Clock, mu sync.Locker, apply func() error, p tiers.Policy) *Controller {
	m := &Controller{log: log, lim: lim, src: src, clock: c, mu: mu, apply: apply, policy: partOf(p)}
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
	if m.policy.auto != nil {
		m.logSignal()
	}
	go func() {
		defer m.closeSource()
		m.run(ctx, stop)
	}()
}

// logSignal logs the signal the controller reads and its law.
func (m *Controller) logSignal() {
	m.log.Info("adaptive max: collector socket drops", "signal", m.src.Signal(), "netns", netnsName(m.netns), "ports", portsString(m.policy.ports),
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

// Learnt is the max the law learnt for policy p, packets per window
// (tiers.State.LearntMax; the agent's mu held): 0 when p has no max: auto,
// when its auto bounds are not those in force (a reload that changes
// them starts again from p's max, Reloaded), and when no controller runs
// (m nil). So a reload with the same auto bounds keeps the learnt max.
func (m *Controller) Learnt(p tiers.Policy) uint64 {
	if m == nil || !m.sameAuto(p) {
		return 0
	}
	return m.law.Max()
}

// sameAuto reports whether p has max: auto with the bounds in force.
func (m *Controller) sameAuto(p tiers.Policy) bool {
	return p.Auto != nil && m.policy.auto != nil && *p.Auto == *m.policy.auto
}

// Reloaded tells the controller that a reload applied p, the new policy
// in force as given (the agent's mu held), with src, the signal SourceFor
// opened for it, or nil: with the same auto bounds the law goes on from
// its learnt max (Learnt), with others it starts again at p.Max. With no
// controller (m nil) it closes src.
func (m *Controller) Reloaded(p tiers.Policy, src DropSource) {
	if m == nil {
		if src != nil {
			src.Close()
		}
		return
	}
	keep := m.sameAuto(p)
	turnedOn := p.Auto != nil && m.policy.auto == nil
	m.policy = partOf(p)
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
		m.log.Info("adaptive max: reload keeps the learnt max", "max", m.law.Max(), "auto", p.Auto.String())
	case p.Auto != nil:
		m.law, m.primed = tiers.NewAutoLaw(*p.Auto, p.Max), false
		m.log.Info("adaptive max: new auto settings, max starts again", "max", p.Max, "auto", p.Auto.String())
	default:
		m.primed = false
	}
}

// Max returns the max in force, packets per window: the learnt one under
// max: auto, the policy's otherwise (not a fleet fallback's).
func (m *Controller) Max() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.policy.auto != nil {
		return m.law.Max()
	}
	return m.policy.max
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
		w := m.policy.window
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
	if m.policy.auto == nil || m.primed && w.Opened == m.opened {
		return
	}
	// Judge in the middle of the new window: the first tier passes its
	// packets, and the socket overflows, at a window's start, so a sample
	// from middle to middle holds each window's burst whole, however late
	// the scheduler runs this tick.
	if st := tiers.WindowNow(m.clock.Now(), w.Counts(), tiers.WindowPolicy{Window: m.policy.window}); st.Elapsed > 0 && st.Elapsed < m.policy.window/2 {
		return
	}
	st, err := m.lim.Stats()
	if err != nil {
		m.readError(err)
		return
	}
	ds, err := m.src.Read(m.policy.ports)
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
				"ports", portsString(m.policy.ports), "max", m.law.Max())
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
	if err := m.apply(); err != nil {
		m.law = old
		m.log.Error("adaptive max: applying the new max failed; the old one stays", "max", nm, "error", err)
		return
	}
	rec.Max = nm
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
