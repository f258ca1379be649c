package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/agent/license"
	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/internal/sysutil"
	"github.com/tierlimit/tierlimit/tiers"
)

// StartAutoMax starts the adaptive-max controller for policy p, the policy
// New or the last Reload applied, reading collector socket drops from src,
// which automax.OpenDropSourceIn opened in p's auto.netns (the agent's network
// namespace when p has none). It runs until ctx ends or the agent closes,
// then closes src. While the policy has no `max: auto` it only follows
// reloads; Reload keeps the learnt max when the auto settings stay the
// same, and opens the signal again when auto.netns changes (a namespace
// where it cannot be read refuses the reload). Returns an error when a
// controller runs already.
func (a *Agent) StartAutoMax(ctx context.Context, p tiers.Policy, src automax.DropSource) (*automax.Controller, error) {
	apply := func() error { // the learnt max changed: the policy in force again
		if a.closed.Load() {
			return errClosed
		}
		return a.apply(context.Background(), a.given, inForce{a})
	}
	m := automax.New(a.log, a.lim, src, sysutil.RealClock{}, &a.applyMu, apply, p)
	if !a.auto.CompareAndSwap(nil, m) {
		return nil, fmt.Errorf("adaptive max: a controller runs already")
	}
	m.Start(ctx, a.closed.Load)
	return m, nil
}

// StartLicense starts the license guard (docs/design.md §13) of policy
// p, the policy New or the last Reload applied, on clock c (nil: the
// real one), keeping the day's spend in statePath ("" for none; the
// default is license.StatePathFor of the episode state file). It runs
// whatever the policy, so that a reload can turn `license:` on, until ctx
// ends or the agent closes: each window it paces the byte budget and
// applies it through the one apply path (tiers.State.LicenseMax); its
// warnings' events go through the shed record's sender (StartRecord).
// Returns an error when a guard runs already.
func (a *Agent) StartLicense(ctx context.Context, p tiers.Policy, statePath string, c license.Clock) (*license.Guard, error) {
	apply := func() error { // the window's budget changed: the policy in force again
		if a.closed.Load() {
			return errClosed
		}
		return a.apply(context.Background(), a.given, inForce{a})
	}
	notify := func(sev int, now time.Time, msgID string, params [][2]string, msg string) bool {
		ps := make([]record.Param, len(params))
		for i, q := range params {
			ps[i] = record.Param{Name: q[0], Value: q[1]}
		}
		return a.record.Load().Notice(sev, now, msgID, ps, msg)
	}
	g := license.New(license.Config{Log: a.log, Lim: a.lim, Clock: c, Mu: &a.applyMu, Apply: apply, Notify: notify,
		State: statePath, Policy: p})
	if !a.lic.CompareAndSwap(nil, g) {
		return nil, fmt.Errorf("license guard: a guard runs already")
	}
	g.Start(ctx, a.closed.Load)
	return g, nil
}

// licenseCollector exports the license guard's metrics while one runs.
type licenseCollector struct{ a *Agent }

func (l licenseCollector) Describe(ch chan<- *prometheus.Desc) { license.Describe(ch) }

func (l licenseCollector) Collect(ch chan<- prometheus.Metric) { l.a.lic.Load().Collect(ch) }

// DefaultStatePath is the episode state file of the agent of pinPath
// (docs/design.md §10): record.DefaultStatePath for DefaultPinPath, else
// record.StatePathFor(pinPath), so that agents with their own pin paths
// never share one.
func DefaultStatePath(pinPath string) string {
	if filepath.Clean(pinPath) == DefaultPinPath {
		return record.DefaultStatePath()
	}
	return record.StatePathFor(pinPath)
}

// hasPinnedLinks says whether pin path p holds a pinned link (P/links/*).
func hasPinnedLinks(p string) bool {
	ents, err := os.ReadDir(filepath.Join(p, "links"))
	return err == nil && len(ents) > 0
}

// AutoMax returns the adaptive-max controller, or nil when none runs.
func (a *Agent) AutoMax() *automax.Controller { return a.auto.Load() }

// StartRecord starts the shed record (docs/design.md §10) of policy p: the
// sample reader (with p.Record.Samples > 0), the pcapng files (with
// p.Record.Dir) and the episode tracker, which reports to p.Events and
// keeps the open or last episode in statePath ("" for none; the default
// is DefaultStatePath of the pin path). An open episode there is taken up
// only when this agent found its pinned links at start and the episode is
// recent (record.StaleAfter); otherwise it is closed. Cancelling
// ctx stops them. A reload changes them all in place (record.Change).
func (a *Agent) StartRecord(ctx context.Context, p tiers.Policy, statePath string) (*record.Episodes, error) {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if a.record.Load() != nil {
		return nil, fmt.Errorf("shed record: started already")
	}
	ep, err := record.Start(ctx, a.log, a.lim, p, a.at.IfName, a.at.IfaceNames, statePath,
		record.Owner{PinPath: a.cfg.PinPath, PinsGone: !a.pinsFound})
	if err != nil {
		return nil, err
	}
	a.record.Store(ep)
	return ep, nil
}

// The metrics of the adaptive max (docs/design.md §5, §8), emitted while a
// controller runs, and of the shed record (§5, §10), once it is started.
var (
	autoAdjustDesc   = metric("auto_max_adjustments_total", "Changes of the adaptive max (max: auto), by direction (up, down).", "direction")
	autoDropsDesc    = metric("collector_socket_drops_total", "Receive-buffer drops of the collector's UDP sockets (the selected ports) seen by the adaptive max.")
	sheddingDesc     = metric("shedding", "1 while a shedding episode is open.")
	episodesDesc     = metric("shed_episodes_total", "Shedding episodes opened.")
	shedSamplesDesc  = metric("shed_samples_total", "Sampled shed packets kept (written), and those the agent could not keep up with or write (lost).", "result")
	eventReportsDesc = metric("event_reports_total", "Episode reports sent to events.syslog (sent), and those not sent (error).", "result")
)

// roomCounts fills in s the counters of the rooms that run.
func roomCounts(s *Snapshot, m *automax.Controller, ep *record.Episodes) {
	if m != nil {
		s.Auto = &AutoCounts{}
		s.Auto.Up, s.Auto.Down, s.Auto.SocketDrops = m.Counts()
	}
	if ep != nil {
		s.Record = ep.Counts()
	}
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

// collectRecord emits the shed record's counters, once it is started.
func collectRecord(ch chan<- prometheus.Metric, s Snapshot) {
	r := s.Record
	if r == nil {
		return
	}
	up := 0.0
	if r.Shedding {
		up = 1
	}
	gauge(ch, sheddingDesc, up)
	counter(ch, episodesDesc, r.Episodes)
	counter(ch, shedSamplesDesc, r.Written, "written")
	counter(ch, shedSamplesDesc, r.Lost, "lost")
	counter(ch, eventReportsDesc, r.Sent, "sent")
	counter(ch, eventReportsDesc, r.Errors, "error")
}
