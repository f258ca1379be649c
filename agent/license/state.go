package license

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// StateFile is the license state's file name beside the episode state
// (agent.DefaultStatePath's directory): license.json for the agent of the
// default pin path, license@<pin path>.json for another (StatePathFor).
const StateFile = "license.json"

// State is what the guard keeps across a restart and an upgrade
// (docs/design.md §13): the day, its spend and the program's passed
// bytes counter when it was written, so that an agent that finds the
// pinned counters again adds what passed while it was away.
type State struct {
	// DayStart is the license day's start; Spent the bytes passed in it
	// (the fleet's total, with fleet:, as the store last answered).
	DayStart time.Time `json:"day_start"`
	DayEnd   time.Time `json:"day_end"`
	Spent    uint64    `json:"spent"`
	// Counter is the program's passed bytes counter at Saved; Own the
	// member's own spend in the day.
	Counter uint64 `json:"counter"`
	Own     uint64 `json:"own"`
	// PerDay, Zone are the license's, for status; Rate the bytes passed
	// per second of license time recently (the projection's), Target and
	// Max the last window's pacing; Members the fleet's member count (0
	// without fleet:).
	PerDay  uint64  `json:"per_day"`
	Zone    string  `json:"zone"`
	Rate    float64 `json:"rate"`
	Target  uint64  `json:"target"`
	Max     uint64  `json:"max"`
	Window  string  `json:"window"`
	Members int     `json:"members,omitempty"`
	// Warned is the day's warnings given: 1 warn_at, 2 spent too; a
	// restart does not give them again.
	Warned int       `json:"warned,omitempty"`
	Saved  time.Time `json:"saved"`
}

// StatePathFor returns the license state file beside the episode state
// file episodeState (agent.DefaultStatePath): episode.json becomes
// license.json, episode@X.json license@X.json.
func StatePathFor(episodeState string) string {
	dir, base := filepath.Split(episodeState)
	if rest, ok := strings.CutPrefix(base, "episode"); ok {
		return filepath.Join(dir, "license"+rest)
	}
	return filepath.Join(dir, StateFile)
}

// ReadState reads the state file at path. Returns an error wrapping
// fs.ErrNotExist when there is none.
func ReadState(path string) (State, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return State{}, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("license state %s: %w", path, err)
	}
	return s, nil
}

// writeState writes s to path atomically: a temporary file beside it,
// fsynced, renamed over path, and the directory fsynced, so a crash
// leaves the old state or the new one, never a torn one.
func writeState(path string, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".license-*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// missing says whether err is a state file that is not there.
func missing(err error) bool { return errors.Is(err, fs.ErrNotExist) }
