package license_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/agent/license"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// rig is a guard on the real program, loaded and not attached, fed
// frames by BPF_PROG_TEST_RUN.
type rig struct {
	lim     *bpf.Limiter
	frame   []byte
	mu      sync.Mutex
	applied int
	events  []string
	log     bytes.Buffer
}

func newRig(t *testing.T, p tiers.Policy) *rig {
	t.Helper()
	testenv.Require(t)
	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	tab, err := tiers.Compile(p, l.Tick())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(context.Background(), tab); err != nil {
		t.Fatal(err)
	}
	return &rig{lim: l, frame: testenv.UDP4(t, 514)}
}

// send runs n frames through the program and returns the bytes it
// passed, as the guard reads them.
func (r *rig) send(t *testing.T, n int) uint64 {
	t.Helper()
	before, err := r.lim.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.lim.Program().Run(&ebpf.RunOptions{Data: r.frame, Repeat: uint32(n)}); err != nil {
		t.Fatal(err)
	}
	after, err := r.lim.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return license.Passed(after) - license.Passed(before)
}

func (r *rig) guard(p tiers.Policy, c license.Clock, state string) *license.Guard {
	return license.New(license.Config{Log: slog.New(slog.NewTextHandler(&r.log, nil)), Lim: r.lim, Clock: c, Mu: &r.mu,
		Apply: func() error { r.applied++; return nil },
		Notify: func(sev int, now time.Time, msgID string, params [][2]string, msg string) bool {
			r.events = append(r.events, msgID)
			return true
		},
		State: state, Policy: p})
}

func licPolicy(t *testing.T, perDay string) tiers.Policy {
	t.Helper()
	// The ordinal shape: these tests count what the program passed, and
	// the smooth shape's onset (docs/design.md §9) would shed a chunk of
	// BPF_PROG_TEST_RUN's packets, all in a few of the clock's ticks, at
	// a recent rate far above max, depending on where the ticks fall.
	p, err := tiers.ParseYAML([]byte("count: bytes\nshape: ordinal\nmax: 10MB\nselect: [{proto: udp, ports: [514]}]\nlicense: {per_day: " + perDay + ", warn_at: 50%}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGuardSpendWarnResume: the guard adds what the program passed to
// the day's spend, warns once at warn_at and once when spent (events and
// counters), writes the state at Stop, and a new guard the same day
// takes the spend up with what passed while none ran; the warnings are
// not given again.
func TestGuardSpendWarnResume(t *testing.T) {
	p := licPolicy(t, "50KB")
	r := newRig(t, p)
	state := filepath.Join(t.TempDir(), "license.json")
	clock := license.NewCompressed(time.Date(2026, 6, 1, 1, 0, 0, 0, time.UTC), 1)
	g := r.guard(p, clock, state)
	if !g.Tick(time.Second) || r.applied != 0 {
		t.Fatalf("first tick: a budget is paced, applied by the caller")
	}
	var passed uint64
	for _, n := range []int{100, 300, 600} {
		passed += r.send(t, n)
		g.Tick(time.Second)
		if got := g.Snapshot().Spent; got != passed {
			t.Fatalf("spent %d, the program passed %d", got, passed)
		}
	}
	if passed < 50e3 {
		t.Fatalf("passed %d bytes, want the day spent (frames of %d bytes)", passed, len(r.frame))
	}
	if len(r.events) != 2 || r.events[0] != "license-warn" || r.events[1] != "license-spent" {
		t.Errorf("events %v, want license-warn then license-spent", r.events)
	}
	if s := g.Snapshot(); s.Max == 0 || s.Target != 0 {
		t.Errorf("spent: target %d, max %d; want 0 and a floor of 1", s.Target, s.Max)
	}
	g.Stop()
	saved, err := license.ReadState(state)
	if err != nil || saved.Spent != passed || saved.Warned != 2 {
		t.Fatalf("state %+v, %v; want spent %d, warned 2", saved, err, passed)
	}
	// No guard runs: the program passes more; the next one adds it.
	more := r.send(t, 50)
	g2 := r.guard(p, clock, state)
	if got := g2.Snapshot().Spent; got != passed+more {
		t.Errorf("resumed spend %d, want %d + %d", got, passed, more)
	}
	g2.Tick(time.Second)
	if len(r.events) != 2 {
		t.Errorf("the resumed guard warned again: %v", r.events)
	}
}

// TestGuardNewDay: the day rolls over at its end and the spend starts
// again; the passes read at the first window of the new day count in it
// (a window across the change counts in the day of its end).
func TestGuardNewDay(t *testing.T) {
	p := licPolicy(t, "1MB")
	r := newRig(t, p)
	state := filepath.Join(t.TempDir(), "license.json")
	// 3,600 × real time from 23:59:58: the day ends in about 0.5 ms.
	clock := license.NewCompressed(time.Date(2026, 6, 1, 23, 59, 58, 0, time.UTC), 3600)
	g := r.guard(p, clock, state)
	g.Tick(time.Second)
	straddle := r.send(t, 100)
	time.Sleep(10 * time.Millisecond)
	g.Tick(time.Second)
	s := g.Snapshot()
	if !s.DayStart.Equal(time.Date(2026, 6, 2, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("day %s, want 2026-06-02", s.DayStart)
	}
	if s.Spent != straddle {
		t.Errorf("a new day's spend is %d, want the %d read at its first window", s.Spent, straddle)
	}
}

// TestGuardFleetLedger: the fleet's side (agent/fleet's LicenseLedger):
// TakeSpend hands the passes not yet added, again after a failed ack;
// FleetSpent makes the day's spend the fleet's total and what was not
// added since; Unreachable paces the last remainder ÷ members on own
// passes.
func TestGuardFleetLedger(t *testing.T) {
	p := licPolicy(t, "10MB")
	r := newRig(t, p)
	clock := license.NewCompressed(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC), 1)
	g := r.guard(p, clock, "")
	g.Tick(time.Second)
	a := r.send(t, 100)
	g.Tick(time.Second)
	d, ack := g.TakeSpend()
	if d != a {
		t.Fatalf("TakeSpend %d, want %d", d, a)
	}
	ack(false)
	b := r.send(t, 10)
	g.Tick(time.Second)
	if d2, ack2 := g.TakeSpend(); d2 != a+b {
		t.Fatalf("after a failed ack TakeSpend %d, want %d", d2, a+b)
	} else {
		ack2(true)
	}
	if d3, _ := g.TakeSpend(); d3 != 0 {
		t.Errorf("after an ack TakeSpend %d, want 0", d3)
	}
	day := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	g.FleetSpent(day, 6e6, 3)
	if s := g.Snapshot(); s.Spent != 6e6 || s.Members != 3 {
		t.Errorf("fleet: spent %d members %d, want 6e6, 3", s.Spent, s.Members)
	}
	g.Unreachable()
	g.Tick(time.Second)
	// (10MB − 6MB) ÷ 3 over the 12 h left, per window of 1 s.
	want := uint64(4_000_000 / 3 / (12 * 3600))
	if s := g.Snapshot(); s.Target < want-1 || s.Target > want+1 {
		t.Errorf("unreachable: target %d, want about %d", s.Target, want)
	}
}

// TestGuardBurstWindow: what passed in the rolling burst window lowers
// the window's target: the cap less the passes of the burst window's
// time before the window.
func TestGuardBurstWindow(t *testing.T) {
	// The ordinal shape: these tests count what the program passed, and
	// the smooth shape's onset (docs/design.md §9) would shed a chunk of
	// BPF_PROG_TEST_RUN's packets, all in a few of the clock's ticks, at
	// a recent rate far above max, depending on where the ticks fall.
	p, err := tiers.ParseYAML([]byte("count: bytes\nshape: ordinal\nmax: 10MB\nselect: [{proto: udp, ports: [514]}]\nlicense: {per_day: 8640MB, burst: {window: 1m, max: 1x}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, p)
	clock := license.NewCompressed(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC), 1)
	g := r.guard(p, clock, "")
	g.Tick(time.Second)
	// per_day 8,640 MB: 100 kB/s on average; the cap 6 MB a minute, 100 kB
	// a window. Nothing passed: the target is the cap per window.
	if s := g.Snapshot(); s.Target != 100_000 {
		t.Fatalf("target %d, want the cap per window 100000", s.Target)
	}
	passed := r.send(t, 50_000) // about 3.4 MB in the burst window
	g.Tick(time.Second)
	want := 6_000_000 - passed
	if s := g.Snapshot(); s.Target != min(100_000, want) {
		t.Errorf("after %d passed: target %d, want %d", passed, s.Target, min(100_000, want))
	}
	passed += r.send(t, 40_000) // past the cap: about 6.1 MB
	g.Tick(time.Second)
	if s := g.Snapshot(); passed > 6_000_000 && s.Target != 1 {
		t.Errorf("burst window spent (%d passed): target %d, want 1", passed, s.Target)
	}
}
