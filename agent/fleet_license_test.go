package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/agent/license"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// fastClock is a license clock that runs factor times faster than the
// real one from origin (license time) at start (real time), with its
// exact inverse: the fleet's day on the store's (real) clock.
type fastClock struct {
	origin, start time.Time
	factor        int64
}

func (c fastClock) at(real time.Time) time.Time {
	return c.origin.Add(time.Duration(c.factor) * real.Sub(c.start))
}

func (c fastClock) Now() time.Time                      { return c.at(time.Now()) }
func (c fastClock) Scale(d time.Duration) time.Duration { return time.Duration(c.factor) * d }

// real is the first real instant whose license time is at or past l.
func (c fastClock) real(l time.Time) time.Time {
	d := l.Sub(c.origin)
	q := d / time.Duration(c.factor)
	if q*time.Duration(c.factor) < d {
		q++
	}
	return c.start.Add(q)
}

// day is fleet.License.Day for lic on the clock: the license day that
// holds the store's real time t, its bounds in real time, named by its
// license start.
func (c fastClock) day(lic *tiers.License) func(time.Time) (time.Time, time.Time, time.Time) {
	return func(t time.Time) (time.Time, time.Time, time.Time) {
		d := lic.DayOf(c.at(t))
		return c.real(d.Start), c.real(d.End), d.Start
	}
}

// simMember is one member's program in the simulation: offered bytes a
// window, the max in force, and what it passed.
type simMember struct {
	mu      sync.Mutex
	offered uint64 // bytes a window
	passed  uint64 // cumulative, the program's pass counter
	sel     uint64 // cumulative selected bytes
	est     uint64 // its R̂ as it reports it, bytes a window
	others  uint64 // the others' sum the controller wrote
	alone   bool   // in fallback: judged alone
	members int    // the members last seen, at the fallback
}

func (m *simMember) Stats() (bpf.Stats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var s bpf.Stats
	s.Payload[tiers.VerdictPass].Bytes = m.passed
	s.Payload[tiers.VerdictDrop].Bytes = m.sel - m.passed
	return s, nil
}

func (m *simMember) FleetEstimate() (uint64, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.est, m.est, nil
}

func (m *simMember) SetFleetOthers(_, total uint64) error {
	m.mu.Lock()
	m.others = total
	m.mu.Unlock()
	return nil
}

// EnterFallback and LeaveFallback: the member judges alone on its own
// offered load, the fallback's max (tiers.Effective) while in fallback.
func (m *simMember) EnterFallback(members int) error {
	m.mu.Lock()
	m.alone, m.members = true, members
	m.mu.Unlock()
	return nil
}

func (m *simMember) LeaveFallback() error {
	m.mu.Lock()
	m.alone = false
	m.mu.Unlock()
	return nil
}

// licenseRun is one compressed license day of three fleet members
// (runLicenseDay).
type licenseRun struct {
	rd               *testenv.Redis
	p                tiers.Policy
	ms               []*simMember
	gs               []*license.Guard
	logs             []*logBuf
	perDay           uint64
	dayStart, dayEnd time.Time // the license day in real time
	inDay            float64   // the fleet's passes in the day
}

// logBuf is a log several goroutines write.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// passedNow is each member's passed bytes so far.
func (r *licenseRun) passedNow() []uint64 {
	out := make([]uint64, len(r.ms))
	for i, m := range r.ms {
		m.mu.Lock()
		out[i] = m.passed
		m.mu.Unlock()
	}
	return out
}

const (
	flWindow  = 200 * time.Millisecond // the smooth shape's least
	flWindows = 100
	flSteps   = 10 // steps a window
)

// runLicenseDay runs three members sharing one license (per_day) over a
// compressed day (24 h in 20 s, 100 windows of 200 ms real), offered 2 ×
// the day's average rate split 50/30/20, each with the real license guard
// (agent/license) as its fleet controller's ledger against one real
// redis-server. The members' programs are the smooth shape's
// expectation: member i passes its offered × P_M(R_fleet) ÷ R_fleet, P
// the tiers' pass curve (tiers.LicensePassed), M the smaller of
// fleet.max and its guard's budget (tiers.Effective; in fallback it
// passes P_M(R_i) alone, M the smaller of the fallback's max and its
// guard's budget), in steps of a tenth
// of a window (traffic goes on between the guards' reads and the
// reports), the max the one in force at the step's start. hook, when
// set, runs after each step (0 to 999). It checks that the fleet's passes
// in the day end within 1 % of per_day and that the store's days hold
// every byte passed.
func runLicenseDay(t *testing.T, name string, hook func(r *licenseRun, step int)) *licenseRun {
	r := startLicenseRun(t, name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.Sleep(time.Until(r.dayStart))
	for _, g := range r.gs {
		g.Tick(0) // its first read of the counters, before anything passed (run's own may come after the first step)
		g.Start(ctx, func() bool { return false })
	}
	var offeredDay float64
	var behind int
	step := 0
	for next := r.dayStart; next.Before(r.dayEnd); step++ {
		maxes, alone := r.inForce()
		next = next.Add(flWindow / flSteps)
		time.Sleep(time.Until(next))
		if time.Since(next) > flWindow/flSteps {
			behind++
		}
		offeredDay += r.pass(maxes, alone)
		if hook != nil {
			hook(r, step)
		}
	}
	perDay := float64(r.perDay)
	t.Logf("the day: %d windows, offered %.0f (%.2f × per_day), passed %.0f = %.4f × per_day; the pacer was behind in %d of %d steps",
		flWindows, offeredDay, offeredDay/perDay, r.inDay, r.inDay/perDay, behind, step)
	if math.Abs(r.inDay/perDay-1) > 0.01 {
		t.Errorf("the fleet passed %.4f × per_day in the day; want within 1 %%", r.inDay/perDay)
	}
	if offeredDay < 1.9*perDay {
		t.Errorf("offered %.2f × per_day; the test means 2 ×", offeredDay/perDay)
	}
	// Every byte passed is in the store's days, once: the last window's,
	// added after the day's end, in the next day's key.
	var all uint64
	for _, n := range r.passedNow() {
		all += n
	}
	if stored := r.storedEventually(t, ctx, name, all); stored != all {
		t.Errorf("the store's days hold %d bytes; the members passed %d", stored, all)
	}
	for i, g := range r.gs {
		s := g.Snapshot()
		t.Logf("member %d: guard day %v spent %d own %d members %d max %d", i, s.DayStart, s.Spent, s.Own, s.Members, s.Max)
	}
	return r
}

// startLicenseRun starts runLicenseDay's store, guards and fleet
// controllers, its day 2 s of real time from now.
func startLicenseRun(t *testing.T, name string) *licenseRun {
	rd := testenv.StartRedis(t, testenv.RedisOptions{})
	const (
		factor  = int64(24 * time.Hour / (flWindows * flWindow)) // 24 h in 20 s
		perDay  = 1_000_000_000
		average = perDay / flWindows // bytes a window
	)
	p, err := tiers.ParseYAML([]byte(fmt.Sprintf(`count: bytes
shape: smooth
window: 200ms
max: %d
select: [{proto: udp, ports: [514]}]
license: {per_day: %d, zone: UTC}
fleet: {name: %s, store: %q, max: %d, report: 25ms, ttl: 1s}
`, 40*average, perDay, name, rd.URL(), 4*average)))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	clk := fastClock{origin: p.License.DayOf(now).End, start: now.Add(2 * time.Second), factor: factor}
	day := p.License.DayOf(clk.at(clk.start))
	shares := []uint64{50, 30, 20}
	r := &licenseRun{rd: rd, p: p, perDay: perDay, dayStart: clk.real(day.Start), dayEnd: clk.real(day.End),
		ms: make([]*simMember, 3), gs: make([]*license.Guard, 3), logs: make([]*logBuf, 3)}
	for i := range r.ms {
		m := &simMember{offered: 2 * average * shares[i] / 100}
		r.ms[i], r.logs[i] = m, &logBuf{}
		var mu sync.Mutex
		r.gs[i] = license.New(license.Config{Log: slog.New(slog.NewTextHandler(r.logs[i], nil)), Lim: m, Clock: clk, Mu: &mu,
			Apply: func() error { return nil }, Policy: p})
		cfg := agent.FleetConfig(p.Fleet, string(rune('a'+i)))
		cfg.Window, cfg.Digest = p.Window, p.FleetDigest()
		cfg.License = &fleet.License{Ledger: r.gs[i], Day: clk.day(p.License)}
		c, err := fleet.Start(cfg, m, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	return r
}

// inForce is each member's max in force (tiers.Effective of its guard's
// budget; in fallback the fallback's) and whether it judges alone.
func (r *licenseRun) inForce() ([]uint64, []bool) {
	maxes, alone := make([]uint64, len(r.ms)), make([]bool, len(r.ms))
	for i, m := range r.ms {
		m.mu.Lock()
		st := tiers.State{LicenseMax: r.gs[i].Max(r.p), Fallback: m.alone, Members: m.members}
		alone[i] = m.alone
		m.mu.Unlock()
		e, _ := tiers.Effective(r.p, st)
		maxes[i] = e.Max
		if e.Fleet != nil && !alone[i] {
			maxes[i] = e.Fleet.Max
		}
	}
	return maxes, alone
}

// pass runs one step of the members' programs under maxes and returns
// what was offered in it.
func (r *licenseRun) pass(maxes []uint64, alone []bool) (offered float64) {
	var fleetR float64
	for _, m := range r.ms {
		fleetR += float64(m.offered)
	}
	for i, m := range r.ms {
		pass := float64(m.offered) * tiers.LicensePassed(r.p.Tiers, float64(maxes[i]), fleetR) / fleetR / flSteps
		if alone[i] { // judged alone on its own load
			pass = tiers.LicensePassed(r.p.Tiers, float64(maxes[i]), float64(m.offered)) / flSteps
		}
		m.mu.Lock()
		m.passed += uint64(pass)
		m.sel += m.offered / flSteps
		m.est = m.offered
		m.mu.Unlock()
		r.inDay += float64(uint64(pass))
		offered += float64(m.offered / flSteps)
	}
	return offered
}

// storedEventually is the sum of the fleet name's day totals in the
// store, once it is want or 3 s have passed.
func (r *licenseRun) storedEventually(t *testing.T, ctx context.Context, name string, want uint64) uint64 {
	rc := redis.NewClient(&redis.Options{Addr: r.rd.Addrs[0]})
	defer rc.Close()
	var stored uint64
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		stored = 0
		ks, err := rc.Keys(ctx, "{tierlimit:fleet:"+name+"}:lic:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			n, _ := rc.HGet(ctx, k, "total").Uint64()
			stored += n
		}
		if stored == want || time.Now().After(deadline) {
			return stored
		}
	}
}

// TestFleetLicenseDay: three members sharing one license over a
// compressed day (runLicenseDay) end the day within 1 % of per_day, and
// the store's days hold every byte the members passed.
func TestFleetLicenseDay(t *testing.T) {
	runLicenseDay(t, "licday", nil)
}

// TestFleetLicensePartition: the same day with the store stopped
// (SIGSTOP) from 30 % to 50 % of it. Once the members are in fallback
// (ttl after the stop) each guard paces alone on the fleet's last
// remainder ÷ the 3 members: each member passes about a third of the
// fleet's passes, where joined the busiest passes its half of them; the
// fleet passes about the remainder at the day's pace. When the store
// resumes the totals take up every byte passed meanwhile (none lost, none
// counted twice) and the day still ends within 1 % of per_day.
func TestFleetLicensePartition(t *testing.T) {
	const stop, resume = 300, 500 // steps: 30 % and 50 % of the day
	const from = stop + 60        // ttl (5 windows) and a window after the stop
	var atStop uint64             // the store's total at the stop
	var p0, p1 []uint64           // the members' passes at from and at resume
	stopped := false
	r := runLicenseDay(t, "licpart", func(r *licenseRun, step int) {
		switch step {
		case stop:
			rc := redis.NewClient(&redis.Options{Addr: r.rd.Addrs[0]})
			ks, _ := rc.Keys(context.Background(), "{tierlimit:fleet:licpart}:lic:*").Result()
			for _, k := range ks {
				n, _ := rc.HGet(context.Background(), k, "total").Uint64()
				atStop += n
			}
			rc.Close()
			r.rd.Signal(t, syscall.SIGSTOP)
			stopped = true
		case from:
			p0 = r.passedNow()
		case resume:
			p1 = r.passedNow()
			r.rd.Signal(t, syscall.SIGCONT)
			stopped = false
		}
	})
	if stopped {
		r.rd.Signal(t, syscall.SIGCONT)
	}
	var span float64
	for i := range p0 {
		span += float64(p1[i] - p0[i])
	}
	// The day's pace for the remainder: (per_day − spent) over the time
	// left at the stop, for the span's windows.
	want := float64(r.perDay-atStop) * float64(resume-from) / float64(flWindows*flSteps-stop)
	t.Logf("in fallback (steps %d..%d): the fleet passed %.0f, the remainder at the day's pace %.0f (%.3f ×); the members %v",
		from, resume, span, want, span/want, func() []float64 {
			out := make([]float64, len(p0))
			for i := range p0 {
				out[i] = float64(p1[i]-p0[i]) / span
			}
			return out
		}())
	if span < 0.85*want || span > 1.15*want {
		t.Errorf("in fallback the fleet passed %.3f × the remainder at the day's pace; want within 15 %%", span/want)
	}
	for i := range p0 {
		if share := float64(p1[i]-p0[i]) / span; share < 0.25 || share > 0.42 {
			t.Errorf("member %d passed %.3f of the fleet's passes in fallback; want about a third (the last remainder ÷ members)", i, share)
		}
		if !strings.Contains(r.logs[i].String(), "out of reach") {
			t.Errorf("member %d's guard was not told the store is out of reach:\n%s", i, r.logs[i])
		}
	}
}
