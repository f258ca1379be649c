// Package license is the license guard (docs/design.md §13): it paces
// each window's byte budget on a SIEM's ingest license (tiers.License),
// reading the program's passed bytes, and hands the budget to the agent,
// which applies it through its one apply path (tiers.State.LicenseMax);
// it keeps the day's spend across restarts in a state file, warns at
// warn_at and when the day is spent (a log line, an RFC 5424 event
// through the episodes' sender, metrics), and with fleet: paces on the
// fleet's remainder (FleetSpent, the fleet room's LicenseLedger). It
// knows nothing of the agent. Linux only, as the program it reads.
package license

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// Limiter is what the guard reads of the limiter: *bpf.Limiter.
type Limiter interface {
	Stats() (bpf.Stats, error)
}

// Notify sends an event in the episode reports' format to
// events.syslog (record.Episodes.Notice, through the door): severity,
// time, MSGID, structured data (name, value pairs) and text; it returns
// whether a destination is configured.
type Notify func(sev int, now time.Time, msgID string, params [][2]string, msg string) bool

// Config is what the door gives the guard.
type Config struct {
	Log *slog.Logger
	Lim Limiter
	// Clock is the license manager's time (Real; Compressed in tests).
	Clock Clock
	// Mu is the door's apply lock; Apply applies the policy in force
	// again with Mu held, reading the new budget (Guard.Max).
	Mu    sync.Locker
	Apply func() error
	// Notify sends the warnings' events; nil sends none.
	Notify Notify
	// State is the state file (StatePathFor); "" keeps none.
	State string
	// Policy is the policy in force at start.
	Policy tiers.Policy
}

// saveEvery bounds how often the state file is written: at most once a
// second of real time, at a day's change and at stop. A crash loses
// nothing of the spend while the program's pinned counters survive (the
// state holds the counter it was written at); without them, at most the
// last second.
const saveEvery = time.Second

// ticksPerWindow is how often the guard paces in a window of the
// policy: twice, so that a window's budget follows the spend within half
// a window when ticks come late on a loaded host.
const ticksPerWindow = 2

// applyStep is the least relative change of the budget that is applied
// (1/64, 1.6 %): a new max is a new table, and the law's integral
// correction makes up for what a smaller change would have passed.
const applyStep = 64

// Guard is the license guard of an agent.
type Guard struct {
	cfg Config

	mu       sync.Mutex
	lic      *tiers.License // nil: the policy has no license, the guard idles
	window   time.Duration
	tiers    []tiers.Tier
	protect  tiers.Percent
	day      tiers.LicenseDay
	spent    uint64 // the day's spend: own, or the fleet's total as last answered plus own since
	own      uint64 // own spend in the day
	counters counts // the program's counters at the last read
	primed   bool   // counters are set
	offered  uint64 // selected bytes per window, the last window's
	protPeak uint64 // protected bytes per window, the recent peak
	burst    []burstEntry
	rate     float64 // bytes passed per second of license time, recently
	pace     tiers.Pace
	max      uint64 // the budget in force (State.LicenseMax)
	warned   int    // 0, levelWarn or levelSpent: the day's warnings given
	lastSave time.Time
	fleet    fleetPart

	warnings [2]atomic.Uint64

	stopOnce sync.Once
	stopCh   chan struct{} // closed by Stop
	done     chan struct{} // closed when run has ended (nil: not started)
}

// counts are what the guard reads of the program's counters, bytes.
type counts struct{ passed, offered, protected uint64 }

// Passed returns the bytes of s the guard counts as passed: the payload
// delivered to the host (bpf.Stats.PassedBytes).
func Passed(s bpf.Stats) uint64 { return readCounts(s).passed }

// readCounts reads the passed, offered (selected) and protected bytes
// of s, the syslog payload that count: bytes counts (bpf.Stats.Payload,
// docs/design.md §2): passed are what the host received (pass and
// would_drop, and the TCP segments counted and never shed:
// bpf.Stats.PassedBytes), offered every verdict's. The program counts the
// severity classes by frame, so the protected payload is the protected
// frames' bytes at the selected traffic's ratio of payload to frame.
func readCounts(s bpf.Stats) counts {
	c := counts{passed: s.PassedBytes(), offered: s.TCPCounted.Bytes}
	var frames, prot uint64
	for _, v := range tiers.Verdicts {
		c.offered += s.Payload[v].Bytes
		frames += s.SelectedTotal(v).Bytes + s.OverBudget[v].Bytes
		prot += s.Severity[tiers.SevProtected][v].Bytes
	}
	if frames > 0 {
		c.protected = uint64(float64(prot) * float64(c.offered-s.TCPCounted.Bytes) / float64(frames))
	}
	return c
}

// New makes the guard of cfg.Policy, taking up the day's spend from the
// state file when it is of the same day.
func New(cfg Config) *Guard {
	if cfg.Clock == nil {
		cfg.Clock = Real{}
	}
	g := &Guard{cfg: cfg, stopCh: make(chan struct{})}
	g.setPolicy(cfg.Policy)
	g.resume()
	return g
}

// setPolicy takes p's license, window and tiers (g.mu held, or before
// run); a new day's start resets the spend.
func (g *Guard) setPolicy(p tiers.Policy) {
	g.lic, g.window, g.tiers, g.protect = p.License.Clone(), p.Window, p.Tiers, tiers.Percent{}
	if p.Severity != nil && len(p.Severity.Protect) > 0 {
		g.protect = p.Severity.ProtectBudget
	}
	if g.lic == nil {
		g.max = 0
		return
	}
	if day := g.lic.DayOf(g.cfg.Clock.Now()); !day.Start.Equal(g.day.Start) {
		g.newDay(day)
	}
}

// newDay starts day: nothing spent, no warning given.
func (g *Guard) newDay(day tiers.LicenseDay) {
	g.day, g.spent, g.own, g.warned, g.burst = day, 0, 0, 0, nil
	g.fleet.newDay()
}

// resume takes up the state file's spend when it is of today; the
// program's counter, when it is at or past the one saved (the pinned
// maps survived), adds what passed while no agent read it.
func (g *Guard) resume() {
	if g.lic == nil || g.cfg.State == "" {
		return
	}
	s, err := ReadState(g.cfg.State)
	if err != nil {
		if !missing(err) {
			g.cfg.Log.Warn("license: state file", "error", err)
		}
		return
	}
	if !s.DayStart.Equal(g.day.Start) {
		g.cfg.Log.Info("license: the state file is of another day", "day_start", s.DayStart, "today", g.day.Start)
		return
	}
	g.spent, g.own, g.rate, g.warned = s.Spent, s.Own, s.Rate, min(max(s.Warned, 0), levelSpent)
	if st, err := g.cfg.Lim.Stats(); err == nil {
		c := readCounts(st)
		if c.passed >= s.Counter {
			g.spent += c.passed - s.Counter
			g.own += c.passed - s.Counter
		}
		g.counters, g.primed = c, true
	}
	g.cfg.Log.Info("license: the day's spend taken up", "spent", s.Spent, "day_start", g.day.Start)
}

// Start runs the guard until ctx ends, Stop or stop says so: a pacing
// twice a window of the policy in force (ticksPerWindow), then the
// state written.
func (g *Guard) Start(ctx context.Context, stop func() bool) {
	g.done = make(chan struct{})
	go func() {
		defer close(g.done)
		g.run(ctx, stop)
	}()
}

// Stop ends the guard's run and waits for it, the state written: the
// door calls it before it takes the apply lock to close (run may wait
// for that lock). g nil does nothing.
func (g *Guard) Stop() {
	if g == nil {
		return
	}
	g.stopOnce.Do(func() { close(g.stopCh) })
	if g.done != nil {
		<-g.done
		return
	}
	g.save(true)
}

func (g *Guard) run(ctx context.Context, stop func() bool) {
	last := time.Now()
	defer g.save(true)
	g.paced(g.Tick(0)) // the first budget at once, not a window later
	for {
		g.mu.Lock()
		w := max(g.window/ticksPerWindow, 10*time.Millisecond)
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-g.stopCh:
			return
		case <-time.After(w):
		}
		if stop() {
			return
		}
		now := time.Now()
		g.paced(g.Tick(now.Sub(last)))
		last = now
		g.save(false)
	}
}

// paced applies the policy in force again when the budget changed.
func (g *Guard) paced(changed bool) {
	if !changed {
		return
	}
	g.cfg.Mu.Lock()
	defer g.cfg.Mu.Unlock()
	if err := g.cfg.Apply(); err != nil {
		g.cfg.Log.Warn("license: apply the window's budget", "error", err)
	}
}

// Tick paces, elapsed real time after the last tick: it reads the
// program's counters, adds what passed to the day's spend, computes the
// budget (tiers.License.Pace) and gives the warnings due. It returns
// whether the budget changed enough to be applied (applyStep).
func (g *Guard) Tick(elapsed time.Duration) bool {
	st, err := g.cfg.Lim.Stats()
	now := g.cfg.Clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lic == nil {
		return false
	}
	if err != nil {
		g.cfg.Log.Warn("license: read the counters", "error", err)
		return false
	}
	if !g.day.Contains(now) {
		g.newDay(g.lic.DayOf(now))
		g.lastSave = time.Time{}
	}
	d := g.delta(readCounts(st), elapsed)
	g.spent += d.passed
	g.own += d.passed
	g.fleet.add(d.passed)
	if lt := g.cfg.Clock.Scale(elapsed).Seconds(); lt > 0 {
		g.rate += 0.2 * (float64(d.passed)/lt - g.rate)
	}
	g.pushBurst(now, d.passed)
	g.pace = g.lic.Pace(g.input(now))
	g.warn(now)
	old := g.max
	if diff := max(g.pace.Max, old) - min(g.pace.Max, old); old == 0 || diff > old/applyStep || g.pace.Target == 0 && g.pace.Max != old {
		g.max = g.pace.Max
		return true
	}
	return false
}

// delta returns what passed, was offered and was protected since the
// last read, the offered and protected scaled to one window; a counter
// that went back (new maps) counts from 0.
func (g *Guard) delta(c counts, elapsed time.Duration) counts {
	prev := g.counters
	if !g.primed {
		prev = c
	}
	g.counters, g.primed = c, true
	sub := func(a, b uint64) uint64 {
		if a < b {
			return a
		}
		return a - b
	}
	d := counts{passed: sub(c.passed, prev.passed), offered: sub(c.offered, prev.offered), protected: sub(c.protected, prev.protected)}
	if elapsed > 0 {
		g.offered = uint64(float64(d.offered) * float64(g.window) / float64(elapsed))
		prot := uint64(float64(d.protected) * float64(g.window) / float64(elapsed))
		g.protPeak = max(g.protPeak-g.protPeak/8, prot)
	}
	return d
}

// burstEntry is what passed in one tick, at its license time.
type burstEntry struct {
	at     time.Time
	passed uint64
}

// pushBurst keeps the passes of the last burst window, by tick.
func (g *Guard) pushBurst(now time.Time, passed uint64) {
	if g.lic.Burst.Window <= 0 {
		return
	}
	g.burst = append(g.burst, burstEntry{now, passed})
	i := 0
	for i < len(g.burst) && !g.burst[i].at.After(now.Add(-g.lic.Burst.Window)) {
		i++
	}
	g.burst = g.burst[i:]
}

// burstSpent are the bytes passed in the burst window's time before the
// window that opens at now (the last Burst.Window − window).
func (g *Guard) burstSpent(now time.Time) uint64 {
	from := now.Add(-g.lic.Burst.Window + g.cfg.Clock.Scale(g.window))
	var n uint64
	for _, e := range g.burst {
		if e.at.After(from) {
			n += e.passed
		}
	}
	return n
}

// input is the law's input for the window opening at now.
func (g *Guard) input(now time.Time) tiers.PaceInput {
	var burst uint64
	if g.lic.Burst.Window > 0 {
		burst = g.burstSpent(now)
	}
	in := tiers.PaceInput{Day: g.day, Now: now, Window: g.cfg.Clock.Scale(g.window), Spent: g.spent, Offered: g.offered,
		BurstSpent: burst, Protected: g.protPeak, Tiers: g.tiers, ProtectBudget: g.protect}
	g.fleet.input(&in, g.own)
	return in
}

// Max returns the window's byte budget for given, the policy in force
// (tiers.State.LicenseMax): 0 when it has no license, when none is paced
// yet, or g is nil.
func (g *Guard) Max(given tiers.Policy) uint64 {
	if g == nil || given.License == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.max
}

// Reloaded takes p, the new policy in force (the door's apply lock
// held): its license, window and tiers; the day's spend stays while the
// day's start does.
func (g *Guard) Reloaded(p tiers.Policy) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.setPolicy(p)
}

// save writes the state file, at most once per saveEvery unless force.
func (g *Guard) save(force bool) {
	g.mu.Lock()
	if g.lic == nil || g.cfg.State == "" || !force && time.Since(g.lastSave) < saveEvery {
		g.mu.Unlock()
		return
	}
	g.lastSave = time.Now()
	s := g.stateLocked()
	g.mu.Unlock()
	if err := writeState(g.cfg.State, s); err != nil {
		g.cfg.Log.Warn("license: state file", "error", err)
	}
}

// stateLocked is the state to write (g.mu held).
func (g *Guard) stateLocked() State {
	return State{DayStart: g.day.Start, DayEnd: g.day.End, Spent: g.spent, Counter: g.counters.passed, Own: g.own,
		PerDay: g.lic.PerDay, Zone: g.lic.ZoneName, Rate: g.rate, Target: g.pace.Target, Max: g.max,
		Window: g.window.String(), Members: g.fleet.members, Warned: g.warned, Saved: g.cfg.Clock.Now()}
}

// Snapshot returns the guard's state now (for tests, check and status).
func (g *Guard) Snapshot() State {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lic == nil {
		return State{}
	}
	return g.stateLocked()
}
