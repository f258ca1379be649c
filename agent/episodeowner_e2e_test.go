package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestRecordEpisodeOwner (issue 43 B76, B77): the episode state file
// belongs to a pin path. Two pin paths have two default state files. On
// the real kernel, an agent takes up an open episode only when it found
// its pin path's links at start and the episode was saved within
// record.StaleAfter: the first agent on a fresh pin path (no pins: the
// limiter ended with the last agent), and one that finds a 72 h old
// episode, close it at its last sighting (the close report gives the
// episode's 10 s, not the days since), and an open episode of another pin
// path is left alone.
func TestRecordEpisodeOwner(t *testing.T) {
	testenv.Require(t)
	pinA, pinB := testenv.PinPath(t, pin.LockFile), testenv.PinPath(t, pin.LockFile)
	if agent.DefaultStatePath(pinA) == agent.DefaultStatePath(pinB) {
		t.Errorf("pin paths %s and %s share the state file %s", pinA, pinB, agent.DefaultStatePath(pinA))
	}
	if got := agent.DefaultStatePath(agent.DefaultPinPath); got != record.DefaultStatePath() {
		t.Errorf("the default pin path's state file %s, want %s", got, record.DefaultStatePath())
	}
	p := newPair(t)
	t.Cleanup(func() { p.Coll.Do(func() error { return pin.Detach(pinA, p.CollIf) }) })
	addr, reports := listenReports(t)
	pol := recordPolicy(t, "", "udp://"+addr)
	state := filepath.Join(t.TempDir(), "episode.json")
	writeOpen := func(pinPath string, saved time.Time) {
		b, _ := json.Marshal(record.Episode{ID: 7, Open: true, Start: saved.Add(-10 * time.Second), Saved: saved,
			PinPath: pinPath, Interfaces: []string{p.CollIf}, Mode: "enforce", Max: recordMax})
		if err := os.WriteFile(state, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	closes := func() (n int, last map[string]string) {
		for _, r := range reports() {
			if r.event == "close" {
				n, last = n+1, r.params
			}
		}
		return n, last
	}
	run := func(what string, wantID uint64, wantOpen bool, wantCloses int) {
		t.Helper()
		a := startPinned(t, p, pinA, pol)
		defer a.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ep, err := a.StartRecord(ctx, pol, state)
		if err != nil {
			t.Fatal(err)
		}
		if c := ep.Current(); c.ID != wantID || c.Open != wantOpen {
			t.Errorf("%s: episode %d open %v, want %d open %v", what, c.ID, c.Open, wantID, wantOpen)
		}
		deadline := time.Now().Add(3 * time.Second)
		for n, _ := closes(); n < wantCloses && time.Now().Before(deadline); n, _ = closes() {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		n, last := closes()
		if n != wantCloses {
			t.Errorf("%s: %d close reports in all, want %d", what, n, wantCloses)
		} else if n > 0 && (last["episode"] != "7" || last["duration"] != "10s") {
			t.Errorf("%s: close report %v, want episode 7 after 10s", what, last)
		}
	}
	writeOpen(pinA, time.Now())
	run("first agent, no pins at start", 7, false, 1)
	writeOpen(pinA, time.Now())
	run("pins found, saved just now", 7, true, 1)
	writeOpen(pinA, time.Now().Add(-72*time.Hour))
	run("pins found, saved 72h ago", 7, false, 2)
	writeOpen(pinB, time.Now())
	run("another pin path's episode", 0, false, 2) // not its episode: none shown
}
