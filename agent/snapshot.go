package agent

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// Snapshot is everything the limiter's maps say at one moment: what
// /metrics and `tierlimit status` both show.
type Snapshot struct {
	Policy bpf.Active
	Stats  bpf.Stats
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
}

// TakeSnapshot reads the limiter's maps.
func TakeSnapshot(l *bpf.Limiter) (Snapshot, error) {
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
	if now, err := monotonic(); err == nil && w.Opened > 0 && int64(now-w.StartNs) > int64(s.Policy.Window) {
		s.WindowPackets, s.LastWindowPackets, s.DropDebt = 0, w.Count, 0
	}
	if s.WindowPackets > 0 {
		s.CurrentTier = tiers.TierOf(s.Policy.Bounds, s.WindowPackets)
	}
	return s, nil
}

func monotonic() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}
