package agent

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// Per-source budgets (docs/design.md §6): what the agent reads, exports and
// logs of them.

// Sources is what the maps say of per-source budgets at one moment.
type Sources struct {
	// Budget is the active budget; Budget.Budget 0 is off.
	Budget tiers.SourceBudget
	// OverBudget counts over-budget packets by tiers.Verdict.
	OverBudget [bpf.NumVerdicts]bpf.Counter
	// Top lists the groups over budget, most packets first.
	Top []bpf.SourceGroup
	// OverRecently is how many groups of Top were over budget in the
	// current or the previous window: approximate, as the table is an LRU
	// of tiers.TopSources groups and a sketch can misjudge a light group.
	OverRecently int
}

// Sources returns what snapshot s says of per-source budgets, with up to
// top groups over budget (top <= 0: all).
func (s Snapshot) Sources(top int) Sources {
	all := s.TopSources
	if top > 0 && len(all) > top {
		all = all[:top]
	}
	return Sources{Budget: s.Policy.Sources, OverBudget: s.Stats.OverBudget, Top: all, OverRecently: s.SourcesOverRecently}
}

// ReadSources reads the budget, the over-budget counters and up to top
// groups over budget (top <= 0: all) from l.
func ReadSources(l *bpf.Limiter, top int) (Sources, error) {
	s, err := TakeSnapshot(l)
	if err != nil {
		return Sources{}, err
	}
	return s.Sources(top), nil
}

// ReadPinnedSources is ReadSources on the maps pinned under pinPath, with no
// agent running (tierlimit status --top).
func ReadPinnedSources(pinPath string, top int) (Sources, error) {
	l, err := pin.CheckLayout(pinPath)
	if err != nil {
		return Sources{}, err
	}
	lim, _, err := bpf.OpenPinned(filepath.Join(pinPath, "maps"), l.Version)
	if err != nil {
		return Sources{}, err
	}
	defer lim.Close()
	return ReadSources(lim, top)
}

// The per-source budget's metrics, with bounded labels: no per-source label.
var (
	overBudgetDesc   = metric("source_over_budget_packets_total", "Selected packets over their source group's budget, by verdict (drop in enforce, would_drop in dry-run, pass in off); not counted in the window.", "verdict")
	sourcesOverDesc  = metric("sources_over_budget", "Source groups over budget in the current or the previous window (approximate: a bounded table).")
	sourceBudgetDesc = metric("policy_source_budget_packets", "Packets per source group and window before packets are over budget; 0 when sources are off.")
	// its twin under count: bytes (docs/design.md §5)
	sourceBudgetBytesDesc = metric("policy_source_budget_bytes", "Payload bytes per source group and window before packets are over budget, under count: bytes.")
)

// collectSources emits the per-source budget families of snapshot s.
func collectSources(ch chan<- prometheus.Metric, s Snapshot) {
	for _, v := range tiers.Verdicts {
		counter(ch, overBudgetDesc, s.Stats.OverBudget[v].Packets, v.String())
	}
	gauge(ch, sourcesOverDesc, float64(s.SourcesOverRecently))
	budget := sourceBudgetDesc
	if s.Policy.Count == tiers.CountBytes {
		budget = sourceBudgetBytesDesc
	}
	gauge(ch, budget, float64(s.Policy.Sources.Budget))
}

// Logging of groups that go over budget: one line per group and window, at
// most sourceLogBurst lines at once and sourceLogRate a second after that;
// the lines held back are counted in the next line that goes out.
const (
	sourceLogBurst = 5
	sourceLogRate  = 1.0
)

// sourceLogger remembers, per group, the last window it logged.
type sourceLogger struct {
	logged  map[netip.Prefix]uint64
	tokens  float64
	last    time.Time
	dropped int
}

func newSourceLogger(l *bpf.Limiter) *sourceLogger {
	sl := &sourceLogger{logged: map[netip.Prefix]uint64{}, tokens: sourceLogBurst, last: time.Now()}
	// Groups already in the table went over before this agent: not news.
	if top, err := l.TopSources(0); err == nil {
		for _, g := range top {
			sl.logged[g.Group] = g.LastWindow
		}
	}
	return sl
}

// check reads the table and logs each group newly over budget.
func (sl *sourceLogger) check(a *Agent, now time.Time) error {
	top, err := a.lim.TopSources(0)
	if err != nil {
		return err
	}
	sl.tokens = min(sourceLogBurst, sl.tokens+now.Sub(sl.last).Seconds()*sourceLogRate)
	sl.last = now
	seen := make(map[netip.Prefix]uint64, len(top))
	for _, g := range top {
		last, ok := sl.logged[g.Group]
		if ok {
			seen[g.Group] = last
		}
		if ok && last >= g.LastWindow {
			continue
		}
		if sl.tokens < 1 {
			sl.dropped++ // held back: tried again next time
			continue
		}
		sl.tokens--
		seen[g.Group] = g.LastWindow
		a.log.Warn("source group over budget", "group", g.Group.String(), "window", g.LastWindow,
			"over_budget_packets", g.Packets, "windows_over", g.Windows, "held_back", sl.dropped)
		sl.dropped = 0
	}
	// Forget groups the table evicted: the map stays as small as the table.
	sl.logged = seen
	return nil
}

// WatchSources logs groups going over budget, every interval until ctx
// ends. Nothing is read while the policy has sources off. Nothing starts it
// but its caller (tierlimit run does).
func (a *Agent) WatchSources(ctx context.Context, interval time.Duration) {
	sl := newSourceLogger(a.lim)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if act, err := a.lim.Active(); err != nil || act.Sources.Budget == 0 {
				continue
			}
			if err := sl.check(a, now); err != nil {
				a.log.Warn("read source budget table", "error", fmt.Errorf("source_top: %w", err))
			}
		}
	}
}
