package record

import (
	"errors"
	"io/fs"
	"maps"
	"time"
)

// resume takes up the episode an earlier agent left in the state file
// (DESIGN.md §10), so that a restart, an upgrade or an OOM kill during a
// flood neither opens the same episode twice nor leaves it never closed:
// an open episode goes on under its ID, its counts so far carried
// (e.carry) and added to what the counters show from this agent's first
// read on, until QuietWindows quiet windows close it; the next episode
// takes the next ID. now is the agent's start.
func (e *Episodes) resume(now time.Time) {
	if e.state == "" {
		return
	}
	saved, err := ReadEpisode(e.state)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			e.log.Warn("episodes: the state file cannot be read: episode IDs start again at 1", "error", err)
		}
		return
	}
	e.episodes.Store(saved.ID)
	if !saved.Open {
		return
	}
	e.cur, e.carry = saved, saved
	e.carry.ByTier, e.carry.ByReason, e.carry.BySeverity = maps.Clone(saved.ByTier), maps.Clone(saved.ByReason), maps.Clone(saved.BySeverity)
	e.resumed = true
	e.nextSummary = now.Add(e.every)
	e.shedding.Store(true)
	e.log.Info("episodes: an episode the previous agent opened goes on", "episode", saved.ID, "since", saved.Start, "shed", saved.Shed)
}

// addCarry adds the counts an episode had before the restart (resume) to
// the current ones.
func (e *Episodes) addCarry() {
	c, k := &e.cur, e.carry
	c.Shed += k.Shed
	c.Samples += k.Samples
	for _, m := range []struct{ dst, src map[string]uint64 }{{c.ByTier, k.ByTier}, {c.ByReason, k.ByReason}, {c.BySeverity, k.BySeverity}} {
		for key, n := range m.src {
			m.dst[key] += n
		}
	}
	if len(c.Top) == 0 {
		c.Top = k.Top
	}
}
