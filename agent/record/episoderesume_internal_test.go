package record

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestEpisodeSurvivesRestart (issue 35 B53): an agent restarted during a
// flood takes up the episode the old one opened, from the state file: no
// second shed-open for it, the close comes under its ID with the totals
// of both agents, and the next episode takes the next ID. The SIEM (a UDP
// listener) sees open 1, close 1, open 2.
func TestEpisodeSurvivesRestart(t *testing.T) {
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := tiers.Default()
	p.Events = tiers.Events{Network: "udp", Addr: ln.LocalAddr().String(), SummaryEvery: time.Hour}
	state := filepath.Join(t.TempDir(), "episode.json")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func(ctx context.Context) *Episodes {
		e := newEpisodes(slog.New(slog.DiscardHandler), nil, nil, p, func() []string { return []string{"veth0"} }, state)
		go e.send.run(ctx)
		return e
	}
	var got []string
	buf := make([]byte, 4096)
	read := func() {
		ln.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := ln.ReadFrom(buf)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		m, err := parseRFC5424(string(buf[:n]))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.params["event"]+" "+m.params["episode"]+" "+m.params["shed"])
	}
	// The pinned counters outlive the agent: both read the same ones.
	var st bpf.Stats
	now := time.Now()
	step := func(e *Episodes, drops uint64) {
		st.Selected[3][tiers.VerdictDrop].Packets += drops
		st.Selected[0][tiers.VerdictPass].Packets += 1000
		now = now.Add(time.Second)
		e.tick(now, st)
	}
	oldCtx, stopOld := context.WithCancel(ctx)
	old := start(oldCtx)
	step(old, 0)
	step(old, 100) // opens episode 1
	step(old, 100)
	// Restarted mid-flood: the old agent's process ends (its sender
	// stops once its open reached the SIEM, as a process that exits sends
	// before it ends or not at all: two live senders would race), and the
	// new agent reads the state file.
	read()
	stopOld()
	st.Selected[3][tiers.VerdictDrop].Packets += 500 // shed while no agent ran: not counted
	e := start(ctx)
	if c := e.Current(); !c.Open || c.ID != 1 {
		t.Fatalf("after the restart: %+v, want episode 1 open", c)
	}
	step(e, 0) // first read: the baseline
	step(e, 50)
	for range QuietWindows {
		step(e, 0)
	}
	c := e.Current()
	if c.Open || c.ID != 1 || c.Shed != 250 || c.ByTier["3"] != 250 {
		t.Errorf("episode after the restart: %+v, want 1 closed with 250 shed", c)
	}
	step(e, 10) // a new flood: episode 2
	if c := e.Current(); !c.Open || c.ID != 2 || c.Shed != 10 {
		t.Errorf("next episode %+v, want 2 open with 10 shed", c)
	}
	for len(got) < 3 {
		read()
	}
	if want := []string{"open 1 ", "close 1 250", "open 2 "}; !slices.Equal(got, want) {
		t.Errorf("the SIEM got %q, want %q", got, want)
	}
}

// TestEpisodeStateCut (issue 43 B77): a state file cut short (a crash
// mid-write on a file system without the atomic write) is refused with a
// warning naming the last ID it still holds, kept as .bad, and the next
// episode takes the ID after it: IDs never restart at 1. The file the
// agent then writes is whole, with no temporary file left.
func TestEpisodeStateCut(t *testing.T) {
	state := filepath.Join(t.TempDir(), "episode.json")
	b, _ := json.MarshalIndent(Episode{ID: 41, Start: time.Now().Add(-time.Hour), End: time.Now().Add(-50 * time.Minute),
		Interfaces: []string{"veth0"}, Mode: "enforce", Max: 100, ByTier: map[string]uint64{"3": 5}}, "", "  ")
	if err := os.WriteFile(state, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	e := newEpisodes(slog.New(slog.NewTextHandler(&logs, nil)), nil, nil, tiers.Default(), func() []string { return []string{"veth0"} }, state)
	if !strings.Contains(logs.String(), "cut or garbled") || !strings.Contains(logs.String(), "last_id=41") {
		t.Errorf("no warning naming the last ID:\n%s", logs.String())
	}
	if _, err := os.Stat(state + ".bad"); err != nil {
		t.Errorf("the cut file was not kept: %v", err)
	}
	var st bpf.Stats
	now := time.Now()
	e.tick(now, st)
	st.Selected[3][tiers.VerdictDrop].Packets += 10
	e.tick(now.Add(time.Second), st)
	if c := e.Current(); !c.Open || c.ID != 42 {
		t.Errorf("next episode %d (open %v), want 42", c.ID, c.Open)
	}
	if got, err := ReadEpisode(state); err != nil || got.ID != 42 || got.Saved.IsZero() {
		t.Errorf("state file after the save: %+v, %v", got, err)
	}
	if _, err := os.Stat(state + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary file left: %v", err)
	}
}
