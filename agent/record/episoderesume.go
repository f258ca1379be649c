package record

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"regexp"
	"strconv"
	"time"
)

// RestartGrace is how long an agent may be down, beyond QuietWindows
// windows, for the next one to take up its open episode: a restart, an
// upgrade, an OOM kill (the unit's RestartSec is 2 s, its stop timeout
// 15 s). An open episode last saved longer ago than StaleAfter is closed
// instead (docs/design.md §10).
const RestartGrace = time.Minute

// StaleAfter is the age past which an open episode in the state file is
// not taken up: QuietWindows windows of the policy plus RestartGrace.
func StaleAfter(window time.Duration) time.Duration {
	return QuietWindows*window + RestartGrace
}

// Owner says whose state file an Episodes keeps.
type Owner struct {
	// PinPath is the agent's pin path: the episodes it writes carry it,
	// and an open episode of another pin path is not taken up. "" for
	// unknown.
	PinPath string
	// PinsGone is set when the agent found no pinned link under its pin
	// path at start (a reboot, a detach, --no-pin): the limiter did not
	// outlive the last agent, so an open episode ended with it.
	PinsGone bool
}

// resume takes up the episode an earlier agent left in the state file
// (docs/design.md §10), so that a restart, an upgrade or an OOM kill during a
// flood neither opens the same episode twice nor leaves it never closed:
// an open episode goes on under its ID, its counts so far carried
// (e.carry) and added to what the counters show from this agent's first
// read on, until QuietWindows quiet windows close it; the next episode
// takes the next ID. An open episode older than StaleAfter, or whose
// pins were gone at start, is closed instead (reported, at the time it
// was last saved); one of another pin path is left alone. now is the
// agent's start.
func (e *Episodes) resume(now time.Time) {
	if e.state == "" {
		return
	}
	saved, mtime, err := readState(e.state)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		e.refuseState(err)
		return
	}
	e.episodes.Store(saved.ID)
	if !saved.Open {
		return
	}
	if saved.PinPath != "" && e.owner.PinPath != "" && saved.PinPath != e.owner.PinPath {
		e.log.Warn("episodes: the state file holds an open episode of another pin path: not taken up (give each agent its own --state-file)",
			"state_file", e.state, "episode", saved.ID, "its_pin_path", saved.PinPath, "pin_path", e.owner.PinPath)
		return
	}
	seen := saved.Saved
	if seen.IsZero() {
		seen = mtime
	}
	if seen.Before(saved.Start) {
		seen = saved.Start
	}
	var why string
	switch stale := StaleAfter(e.window); {
	case e.owner.PinsGone:
		why = "the limiter's pins were gone at start (a reboot, a detach or --no-pin): it ended with the last agent"
	case now.Sub(seen) > stale:
		why = fmt.Sprintf("last saved %s ago, longer than %s (%d windows and the restart grace)",
			now.Sub(seen).Round(time.Second), stale, QuietWindows)
	}
	if why != "" {
		e.cur = saved
		e.cur.Open, e.cur.End, e.cur.PinPath = false, seen, e.owner.PinPath
		e.log.Warn("episodes: an episode the previous agent left open is closed at its last sighting, not taken up",
			"episode", saved.ID, "last_saved", seen, "reason", why)
		e.report("close", seen)
		return
	}
	e.cur, e.carry = saved, saved
	e.carry.ByTier, e.carry.ByReason, e.carry.BySeverity = maps.Clone(saved.ByTier), maps.Clone(saved.ByReason), maps.Clone(saved.BySeverity)
	e.resumed = true
	e.nextSummary = now.Add(e.every)
	e.shedding.Store(true)
	e.log.Info("episodes: an episode the previous agent opened goes on", "episode", saved.ID, "since", saved.Start, "shed", saved.Shed)
}

// stateIDRE finds an episode ID in a state file that does not parse.
var stateIDRE = regexp.MustCompile(`"id"\s*:\s*([0-9]+)`)

// StateError is a state file that does not parse (cut or garbled). ID is
// the last episode ID it still holds, 0 when none can be read.
type StateError struct {
	Path string
	ID   uint64
	Err  error
}

func (e *StateError) Error() string {
	return fmt.Sprintf("state file %s is cut or garbled: %v", e.Path, e.Err)
}

func (e *StateError) Unwrap() error { return e.Err }

// readState reads the state file and its modification time; a file that
// does not parse is a *StateError.
func readState(path string) (Episode, time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Episode{}, time.Time{}, err
	}
	var mtime time.Time
	if fi, err := os.Stat(path); err == nil {
		mtime = fi.ModTime()
	}
	var ep Episode
	if err := json.Unmarshal(b, &ep); err != nil {
		se := &StateError{Path: path, Err: err}
		for _, m := range stateIDRE.FindAllSubmatch(b, -1) {
			if id, err := strconv.ParseUint(string(m[1]), 10, 64); err == nil {
				se.ID = max(se.ID, id)
			}
		}
		return Episode{}, mtime, se
	}
	return ep, mtime, nil
}

// refuseState warns of a state file that cannot be taken up, keeping the
// last episode ID it holds, so that IDs never go back; the file is kept
// beside, as .bad, for a look.
func (e *Episodes) refuseState(err error) {
	var se *StateError
	if !errors.As(err, &se) {
		e.log.Warn("episodes: the state file cannot be read: refused; episode IDs start again at 1", "state_file", e.state, "error", err)
		return
	}
	os.Rename(e.state, e.state+".bad")
	if se.ID == 0 {
		e.log.Warn("episodes: the state file is cut or garbled and holds no episode ID: refused, kept as .bad; episode IDs start again at 1",
			"state_file", e.state, "error", se.Err)
		return
	}
	e.episodes.Store(se.ID)
	e.log.Warn("episodes: the state file is cut or garbled: refused, kept as .bad; episode IDs go on after the last it holds",
		"state_file", e.state, "last_id", se.ID, "error", se.Err)
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
