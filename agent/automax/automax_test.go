package automax

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sysutil"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// fakeLimiter is the limiter's counters as the test sets them.
type fakeLimiter struct {
	mu    sync.Mutex
	stats bpf.Stats
	win   bpf.Window
}

func (f *fakeLimiter) Stats() (bpf.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats, nil
}

func (f *fakeLimiter) Window() (bpf.Window, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.win, nil
}

// fakeDrops is a DropSource whose next reading the test sets.
type fakeDrops struct {
	mu      sync.Mutex
	drops   uint64
	sockets int
	full    float64
	ports   []tiers.PortRange
}

func (f *fakeDrops) Read(ports []tiers.PortRange) (DropSample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := DropSample{Drops: f.drops, Sockets: f.sockets, Full: f.full}
	f.drops, f.ports = 0, ports
	return s, nil
}
func (f *fakeDrops) Signal() string { return "fake" }
func (f *fakeDrops) Close() error   { return nil }

// fakeClock fires After when the test says.
type fakeClock struct {
	asked chan time.Duration
	fire  chan time.Time
	now   atomic.Uint64
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.asked <- d
	return c.fire
}

func (c *fakeClock) Now() uint64 { return c.now.Load() }

// rig is a controller on fakes; applied records each max applied.
type rig struct {
	t       *testing.T
	lim     *fakeLimiter
	src     *fakeDrops
	mu      sync.Mutex
	m       *Controller
	applied []uint64
	logs    *testenv.SyncBuffer
}

func autoPolicy(t *testing.T, src string) tiers.Policy {
	t.Helper()
	p, err := tiers.ParseYAML([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const autoYAML = "max: auto\nauto: {start: 40000, floor: 1000, ceiling: 200000}\nselect: [{proto: udp, ports: [514]}]\n"

func newRig(t *testing.T, p tiers.Policy) *rig {
	r := &rig{t: t, lim: &fakeLimiter{}, src: &fakeDrops{sockets: 1}, logs: &testenv.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(r.logs, nil))
	r.m = New(log, r.lim, r.src, sysutil.RealClock{}, &r.mu, func() error {
		q := p.WithMax(r.m.Learnt(p)) // the agent's tiers.State.Learnt
		if err := q.Validate(); err != nil {
			return err
		}
		r.applied = append(r.applied, q.Max)
		return nil
	}, p)
	r.m.tick() // the baseline
	return r
}

// window ends a limiter window with these counts and judges it.
func (r *rig) window(delivered, shed, drops uint64) uint64 {
	r.lim.mu.Lock()
	r.lim.stats.Selected[0][tiers.VerdictPass].Packets += delivered
	r.lim.stats.Selected[3][tiers.VerdictDrop].Packets += shed
	r.lim.win.Opened++
	r.lim.mu.Unlock()
	r.src.mu.Lock()
	r.src.drops += drops
	r.src.mu.Unlock()
	r.m.tick()
	return r.m.Max()
}

// TestAutoAppliesCuts: the controller applies each cut of the law
// (tiers/autolaw_test.go has the law's own cases), counts and logs it.
func TestAutoAppliesCuts(t *testing.T) {
	r := newRig(t, autoPolicy(t, autoYAML))
	steps := []struct {
		name                   string
		delivered, shed, drops uint64
		want                   uint64
	}{
		{"5% of what was delivered dropped: max × 0.95", 20000, 30000, 1000, 38000},
		{"the window after a cut is not cut", 20000, 30000, 18000, 38000},
		{"drops go on: the cut is bounded by Beta", 20000, 30000, 18000, uint64(38000 * tiers.AutoBeta)},
		{"a clean window", 20000, 30000, 0, 26600},
		{"first drops after a clean window: bounded by BetaFirst", 20000, 30000, 18000, uint64(26600 * tiers.AutoBetaFirst)},
		{"clean", 1000000, 1, 0, 23940},
		{"one drop in a million still lowers max by one packet", 1000000, 1, 1, 23939},
		{"clean", 1000000, 1, 0, 23939},
		{"drops with nothing delivered: BetaFirst", 0, 100, 5, 21545},
	}
	var total uint64
	for i, c := range steps {
		total += c.drops
		if got := r.window(c.delivered, c.shed, c.drops); got != c.want {
			t.Errorf("window %d (%s): max %d, want %d", i+1, c.name, got, c.want)
		}
	}
	if n := len(r.applied); n != 5 || r.m.down.Load() != 5 || r.m.up.Load() != 0 {
		t.Errorf("%d policies applied, down %d up %d; want 5 cuts", n, r.m.down.Load(), r.m.up.Load())
	}
	if got := r.m.socketDrops.Load(); got != total {
		t.Errorf("socket drops total %d, want %d", got, total)
	}
	if !strings.Contains(r.logs.String(), "direction=down") || !strings.Contains(r.logs.String(), "cause=") {
		t.Errorf("no info log with the cause:\n%s", r.logs)
	}
}

func TestAutoAppliesWithinBounds(t *testing.T) {
	p := autoPolicy(t, "max: auto\nauto: {start: 1000, floor: 900, ceiling: 1100}\n")
	r := newRig(t, p)
	for range 5 {
		r.window(100, 1000, 500)
	}
	if got := r.m.Max(); got != 900 {
		t.Fatalf("max after many cuts = %d, want floor 900", got)
	}
	if n := len(r.applied); n != 1 {
		t.Errorf("%d changes applied; once at the floor nothing more is applied", n)
	}
	for range 40 {
		r.window(1000, 1000, 0)
	}
	if got := r.m.Max(); got != 1100 {
		t.Fatalf("max after many clean windows = %d, want ceiling 1100", got)
	}
	for _, ap := range r.applied {
		if ap < 900 || ap > 1100 {
			t.Errorf("applied max %d outside [900, 1100]", ap)
		}
	}
}

// TestAutoCutsGrowingBacklog: the controller reads the collector's receive
// buffer fill mid-window and gives it to the law, which cuts a growing
// backlog (tiers/autolaw_test.go has the law's own cases): at every window
// the controller's max is the law's, fed the same counts and fills, and
// each cut is counted and logged with its cause.
func TestAutoCutsGrowingBacklog(t *testing.T) {
	r := newRig(t, autoPolicy(t, autoYAML))
	law := tiers.NewAutoLaw(*r.m.policy.auto, r.m.Max())
	for i, full := range []float64{0.8, 0.85, 0.95, 0.9, 0.9, 0.91, 0.99, 0.2, 0.45, 0.55, 0, 0} {
		shed := uint64(100)
		if i == 6 {
			shed = 0 // grows while nothing is shed
		}
		r.src.full = full
		want, _ := law.Judge(tiers.AutoSample{Delivered: 30000, Shed: shed, Full: full})
		if got := r.window(30000, shed, 0); got != want {
			t.Errorf("window %d (fill %.0f%%): max %d, the law's %d", i+1, 100*full, got, want)
		}
	}
	if n := r.m.down.Load(); n != 2 || !strings.Contains(r.logs.String(), "receive buffer grew from 45% to 55% full") {
		t.Errorf("%d cuts, want 2, each logged with its cause:\n%s", n, r.logs)
	}
}

func TestAutoOneChangePerWindow(t *testing.T) {
	r := newRig(t, autoPolicy(t, autoYAML))
	r.src.drops = 5000
	// Ticks without a new window judge nothing, whatever the socket says.
	for range 20 {
		r.m.tick()
	}
	if len(r.applied) != 0 {
		t.Fatalf("%d changes without a window ending", len(r.applied))
	}
	// Each window ending is judged once: at most one change for one
	// window, even when ticks repeat (and none in the window after a cut).
	for i := 1; i <= 5; i++ {
		r.window(20000, 30000, 5000)
		n := len(r.applied)
		r.m.tick()
		r.m.tick()
		if len(r.applied) != n || n != (i+1)/2 {
			t.Fatalf("after %d windows %d changes, then %d after repeated ticks; want %d", i, n, len(r.applied), (i+1)/2)
		}
	}
	// Drops that came before the window opened were judged in it: the
	// drop source was read once per judgement.
	if h := r.m.History(); len(h) != 5 || h[0].SocketDrops != 10000 || h[1].SocketDrops != 5000 {
		t.Errorf("history %+v", h)
	}
}

func TestAutoReloadKeepsLearntMax(t *testing.T) {
	p := autoPolicy(t, autoYAML)
	r := newRig(t, p)
	r.window(20000, 30000, 10000)
	learnt := r.m.Max()
	if learnt == 40000 {
		t.Fatal("no cut")
	}
	reload := func(p tiers.Policy) uint64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		learnt := r.m.Learnt(p)
		r.m.Reloaded(p, nil)
		if learnt == 0 {
			return p.Max
		}
		return learnt
	}
	// The same file, or another change than the auto block: max stays.
	same := autoPolicy(t, autoYAML+"window: 2s\n")
	if got := reload(same); got != learnt {
		t.Errorf("reload with unchanged auto: max %d, want the learnt %d", got, learnt)
	}
	if r.m.policy.window != 2*time.Second {
		t.Error("reload did not take the rest of the policy")
	}
	// The law goes on from there: the window count carried on.
	r.window(20000, 30000, 0)
	if got := r.window(20000, 30000, 2000); got >= learnt {
		t.Errorf("no cut after reload: %d", got)
	}
	// Changed bounds: start again.
	changed := autoPolicy(t, strings.Replace(autoYAML, "floor: 1000", "floor: 2000", 1))
	if got := reload(changed); got != 40000 {
		t.Errorf("reload with changed auto: max %d, want start 40000", got)
	}
	// A fixed max turns the controller off: windows change nothing.
	fixed := autoPolicy(t, "max: 5000\n")
	if got := reload(fixed); got != 5000 {
		t.Errorf("fixed max reloaded as %d", got)
	}
	n := len(r.applied)
	for range 5 {
		r.window(100, 100, 1000)
	}
	if len(r.applied) != n {
		t.Errorf("controller changed a fixed max")
	}
	// And back to auto: start, new baseline, then judged again.
	if got := reload(p); got != 40000 {
		t.Errorf("auto again: max %d, want start", got)
	}
	r.m.tick()
	if got := r.window(20000, 30000, 2000); got != 40000*9/10 {
		t.Errorf("after auto came back: max %d, want %d", got, 40000*9/10)
	}
}

func TestAutoMissingSocket(t *testing.T) {
	r := newRig(t, autoPolicy(t, autoYAML))
	r.src.sockets = 0
	for range 5 {
		r.window(20000, 30000, 3000)
	}
	if got := r.m.Max(); got != 40000 || len(r.applied) != 0 {
		t.Fatalf("max %d without a collector socket, want held at 40000", got)
	}
	if n := strings.Count(r.logs.String(), "no collector socket"); n != 1 {
		t.Errorf("said %d times that the socket is missing, want once:\n%s", n, r.logs)
	}
	if r.src.ports[0] != (tiers.PortRange{First: 514, Last: 514}) {
		t.Errorf("read ports %v, want udp 514", r.src.ports)
	}
	r.src.sockets = 1
	if got := r.window(20000, 30000, 2000); got != 36000 {
		t.Errorf("socket back: max %d, want 36000", got)
	}
	if !strings.Contains(r.logs.String(), "collector socket found") {
		t.Errorf("no log of the socket appearing:\n%s", r.logs)
	}
	r.src.sockets = 0
	r.window(20000, 30000, 0)
	if n := strings.Count(r.logs.String(), "no collector socket"); n != 2 {
		t.Errorf("a restart (socket gone again) is said once more: %d", n)
	}
}

// TestAutoRun drives the loop with a fake clock: it asks for a tick every
// window/autoPolls, judges on each, and ends with its context.
func TestAutoRun(t *testing.T) {
	r := newRig(t, autoPolicy(t, autoYAML+"window: 800ms\n"))
	c := &fakeClock{asked: make(chan time.Duration), fire: make(chan time.Time)}
	c.now.Store(uint64(time.Hour))
	r.m.clock = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.m.run(ctx, func() bool { return false }); close(done) }()
	for i := range 3 {
		if d := <-c.asked; d != 25*time.Millisecond {
			t.Fatalf("tick %d asked for %v, want window/32 = 25ms", i, d)
		}
		r.lim.mu.Lock()
		r.lim.stats.Selected[0][tiers.VerdictPass].Packets += 1000
		r.lim.win.Opened++
		r.lim.mu.Unlock()
		r.src.mu.Lock()
		r.src.drops = 100
		r.src.mu.Unlock()
		c.fire <- time.Time{}
	}
	<-c.asked
	cancel()
	<-done
	// Windows 1 and 3 cut; window 2 came right after a cut.
	if n, h := r.m.down.Load(), r.m.History(); n != 2 || len(h) != 3 {
		t.Errorf("%d cuts, %d windows judged; want 2 and 3", n, len(h))
	}
}

// TestAutoConverges runs the law against a model collector: each window
// the limiter delivers what the seed's tiers pass of the offered load (88%
// of max when offered ≥ max), the collector takes its capacity, its socket
// buffer holds buf datagrams and drops the rest. The case: 50,000
// offered per window, start 40,000, a 10,000 collector, then 30,000.
func TestAutoConverges(t *testing.T) {
	p := autoPolicy(t, autoYAML)
	r := newRig(t, p)
	const offered, buf = 50000, 2000
	delivered := func(m uint64) uint64 {
		e, err := tiers.Expected(p.WithMax(m), offered)
		if err != nil {
			t.Fatal(err)
		}
		return uint64(e.Passed)
	}
	queue := uint64(0)
	run := func(capacity uint64, windows int, phase string) []uint64 {
		var traj []uint64
		for i := range windows {
			m := r.m.Max()
			d := delivered(m)
			// The collector takes capacity in the window; the buffer holds
			// buf more; the rest is dropped at the socket.
			drops := uint64(0)
			if room := buf - queue + capacity; d > room {
				drops = d - room
			}
			queue = min(buf, (queue+d-drops)-min(queue+d-drops, capacity))
			r.src.full = float64(queue) / buf
			r.window(d, offered-d, drops)
			traj = append(traj, m)
			t.Logf("%s window %2d: max %6d delivered %6d socket drops %6d", phase, i+1, m, d, drops)
		}
		return traj
	}
	traj := run(10000, 15, "slow")
	// From window 10 on: drops under 1% of offered, and the collector
	// gets at least 90% of its capacity.
	for i := 9; i < 15; i++ {
		d := delivered(traj[i])
		if d < 9000 {
			t.Errorf("slow window %d: max %d delivers %d < 90%% of 10000", i+1, traj[i], d)
		}
	}
	last := r.m.History()[len(r.m.History())-5:]
	for _, w := range last {
		if w.SocketDrops >= offered/100 {
			t.Errorf("slow window %d: %d socket drops ≥ 1%% of offered", w.Window, w.SocketDrops)
		}
	}
	traj = run(30000, 30, "fast")
	if d := delivered(traj[len(traj)-1]); d < 27000 {
		t.Errorf("after 30 fast windows max %d delivers %d < 90%% of 30000", traj[len(traj)-1], d)
	}
}

// TestAutoJudgesMidWindow: a window is judged once the next one is half
// over, so that the burst at each window's start falls whole in one sample.
func TestAutoJudgesMidWindow(t *testing.T) {
	r := newRig(t, autoPolicy(t, autoYAML)) // window 1s
	c := &fakeClock{}
	r.m.clock = c
	r.lim.mu.Lock()
	r.lim.win.StartNs = uint64(10 * time.Second)
	r.lim.mu.Unlock()
	c.now.Store(uint64(10*time.Second + 100*time.Millisecond))
	r.window(20000, 30000, 5000)
	if len(r.m.History()) != 0 {
		t.Fatal("judged 100 ms into the new window")
	}
	c.now.Store(uint64(10*time.Second + 499*time.Millisecond))
	r.m.tick()
	if len(r.m.History()) != 0 {
		t.Fatal("judged 499 ms into the new window")
	}
	c.now.Store(uint64(10*time.Second + 500*time.Millisecond))
	r.m.tick()
	if h := r.m.History(); len(h) != 1 || h[0].SocketDrops != 5000 || r.m.Max() != 36000 {
		t.Fatalf("at mid-window: history %+v, max %d", h, r.m.Max())
	}
}

// TestAutoStartLog: the controller logs its signal and law when it starts
// under `max: auto`, or when a reload turns `max: auto` on; never under a
// fixed max, where nothing adapts.
func TestAutoStartLog(t *testing.T) {
	const line = "adaptive max: collector socket drops"
	for _, c := range []struct {
		name, start, reload string
		want                int // lines logged after start, after the reload
		wantReload          int
	}{
		{"fixed", "max: 20\n", "", 0, 0},
		{"auto", autoYAML, "", 1, 1},
		{"fixed, reloaded as auto", "max: 20\n", autoYAML, 0, 1},
		{"auto, reloaded as fixed", autoYAML, "max: 20\n", 1, 1},
		{"fixed, reloaded with another fixed max", "max: 20\n", "max: 30\n", 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, autoPolicy(t, c.start))
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			r.m.Start(ctx, func() bool { return false })
			if n := strings.Count(r.logs.String(), line); n != c.want {
				t.Errorf("start: %d lines %q, want %d:\n%s", n, line, c.want, r.logs)
			}
			if c.want > 0 && !strings.Contains(r.logs.String(), "law=") {
				t.Errorf("start: no law logged:\n%s", r.logs)
			}
			if c.reload == "" {
				return
			}
			r.mu.Lock()
			p := autoPolicy(t, c.reload)
			r.m.Reloaded(p, nil)
			r.mu.Unlock()
			if n := strings.Count(r.logs.String(), line); n != c.wantReload {
				t.Errorf("after the reload: %d lines %q, want %d:\n%s", n, line, c.wantReload, r.logs)
			}
		})
	}
}
