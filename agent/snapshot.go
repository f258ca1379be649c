package agent

import (
	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sysutil"
	"github.com/tierlimit/tierlimit/tiers"
)

// Snapshot is everything the limiter's maps say at one moment: what
// /metrics and `tierlimit status` both show. A scrape takes exactly one, so
// that every family of one scrape (tiers, severity, sources) comes from the
// same read of the maps.
type Snapshot struct {
	Policy bpf.Active
	// Stats holds every per-CPU counter: the tiers', severity's and the
	// over-budget ones, read together.
	Stats bpf.Stats
	// WindowPackets is n of the current window: 0 once the window has
	// expired, since the next selected packet opens a new one.
	WindowPackets uint64
	// LastWindowPackets is the final n of the previous window (the offered
	// load), or of the expired current one.
	LastWindowPackets uint64
	// CurrentTier is the tier of the latest selected packet of the current
	// window, 0 when the window is empty.
	CurrentTier int
	// WindowsOpened counts windows since the maps were created.
	WindowsOpened uint64
	// DropDebt is the current window's drop debt (severity): 0 once the
	// window has expired.
	DropDebt uint64
	// TopSources is the program's table of groups over budget, most
	// packets first (docs/design.md §6).
	TopSources []bpf.SourceGroup
	// SourcesOverRecently is how many groups of TopSources were over budget
	// in the current or the previous window: approximate, as the table is an
	// LRU of tiers.TopSources groups and a sketch can misjudge a light group.
	SourcesOverRecently int
	// Auto holds the adaptive-max controller's counters (docs/design.md §8): nil
	// when no controller runs, as in `tierlimit status`. It is the agent's,
	// not the maps': the collector fills it in.
	Auto *AutoCounts
	// Record holds the shed record's counters (docs/design.md §10): nil when
	// the record was not started. The agent's, like Auto.
	Record *record.Counts
	// ConfigWatch is how the agent's Reloader notices config changes
	// (WatchNone without one); the agent's, filled in by the collector.
	ConfigWatch WatchMode
}

// AutoCounts are the adaptive-max controller's counters.
type AutoCounts struct {
	// Up and Down count the changes of max by direction.
	Up, Down uint64
	// SocketDrops are the collector sockets' receive-buffer drops seen.
	SocketDrops uint64
}

// mapReader is what a snapshot reads of the limiter: *bpf.Limiter, or a
// test's wrapper that counts the reads.
type mapReader interface {
	Active() (bpf.Active, error)
	Stats() (bpf.Stats, error)
	Window() (bpf.Window, error)
	TopSources(n int) ([]bpf.SourceGroup, error)
}

// TakeSnapshot reads the limiter's maps.
func TakeSnapshot(l *bpf.Limiter) (Snapshot, error) { return takeSnapshot(l) }

func takeSnapshot(l mapReader) (Snapshot, error) {
	var s Snapshot
	var err error
	if s.Policy, err = l.Active(); err != nil {
		return s, err
	}
	if s.Stats, err = l.Stats(); err != nil {
		return s, err
	}
	w, err := l.Window()
	if err != nil {
		return s, err
	}
	s.WindowsOpened = w.Opened
	s.WindowPackets, s.LastWindowPackets, s.DropDebt = w.Count, w.LastCount, w.Debt
	if now, err := sysutil.Monotonic(); err == nil {
		ws := tiers.WindowNow(now, w.Counts(), s.Policy.WindowPolicy())
		s.WindowPackets, s.LastWindowPackets, s.DropDebt, s.CurrentTier = ws.Count, ws.LastCount, ws.Debt, ws.Tier
	}
	if s.TopSources, err = l.TopSources(0); err != nil {
		return s, err
	}
	for _, g := range s.TopSources {
		if g.LastWindow+1 >= w.Opened {
			s.SourcesOverRecently++
		}
	}
	return s, nil
}
