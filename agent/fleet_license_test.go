package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
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
}

func (m *simMember) Stats() (bpf.Stats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var s bpf.Stats
	s.Selected[0][tiers.VerdictPass].Bytes = m.passed
	s.Selected[0][tiers.VerdictDrop].Bytes = m.sel - m.passed
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

func (*simMember) EnterFallback(int) error { return nil }
func (*simMember) LeaveFallback() error    { return nil }

// TestFleetLicenseDay: three members sharing one license (per_day) over a
// compressed day (24 h in 20 s, 100 windows of 200 ms real), offered 2 × the
// day's average rate split 50/30/20, each with the real license guard
// (agent/license) as its fleet controller's ledger against one real
// redis-server: the fleet's passes in the day end within 1 % of per_day,
// and the store's day total is every byte the members added. The
// members' programs are the smooth shape's expectation: member i passes
// its offered × P_M(R_fleet) ÷ R_fleet a window, P the tiers' pass curve
// (tiers.LicensePassed), M the smaller of fleet.max and its guard's
// budget (tiers.Effective).
func TestFleetLicenseDay(t *testing.T) {
	rd := testenv.StartRedis(t, testenv.RedisOptions{})
	const (
		window  = 200 * time.Millisecond // the smooth shape's least
		windows = 100
		factor  = int64(24 * time.Hour / (windows * window)) // 24 h in 20 s
		perDay  = 1_000_000_000
		average = perDay / windows // bytes a window
	)
	p, err := tiers.ParseYAML([]byte(fmt.Sprintf(`count: bytes
shape: smooth
window: 200ms
max: %d
select: [{proto: udp, ports: [514]}]
license: {per_day: %d, zone: UTC}
fleet: {name: licday, store: %q, max: %d, report: 25ms, ttl: 1s}
`, 40*average, perDay, rd.URL(), 4*average)))
	if err != nil {
		t.Fatal(err)
	}
	// The license day starts 2 s of real time from now.
	now := time.Now()
	origin := p.License.DayOf(now).End
	clk := fastClock{origin: origin, start: now.Add(2 * time.Second), factor: factor}
	day := p.License.DayOf(clk.at(clk.start))
	dayStart, dayEnd := clk.real(day.Start), clk.real(day.End)

	shares := []uint64{50, 30, 20}
	ms := make([]*simMember, 3)
	gs := make([]*license.Guard, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range ms {
		ms[i] = &simMember{offered: 2 * average * shares[i] / 100}
		var mu sync.Mutex
		gs[i] = license.New(license.Config{Log: slog.New(slog.DiscardHandler), Lim: ms[i], Clock: clk, Mu: &mu,
			Apply: func() error { return nil }, Policy: p})
		cfg := agent.FleetConfig(p.Fleet, string(rune('a'+i)))
		cfg.Window, cfg.Digest = p.Window, p.FleetDigest()
		cfg.License = &fleet.License{Ledger: gs[i], Day: clk.day(p.License)}
		c, err := fleet.Start(cfg, ms[i], ms[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	time.Sleep(time.Until(dayStart))
	for _, g := range gs {
		g.Tick(0) // its first read of the counters, before anything passed
		g.Start(ctx, func() bool { return false })
	}
	// The programs: each member passes its share of what the fleet passes
	// under its max in force, in steps of a tenth of a window (traffic
	// goes on between the guards' reads and the reports), the max the
	// one in force at the step's start.
	const steps = 10
	var inDay, offeredDay float64
	var behind int
	for next := dayStart; next.Before(dayEnd); {
		var fleetR float64
		maxes := make([]uint64, len(ms))
		for i, m := range ms {
			fleetR += float64(m.offered)
			st, _ := tiers.Effective(p, tiers.State{LicenseMax: gs[i].Max(p)})
			maxes[i] = st.Fleet.Max
		}
		next = next.Add(window / steps)
		time.Sleep(time.Until(next))
		if time.Since(next) > window/steps {
			behind++
		}
		for i, m := range ms {
			pass := float64(m.offered) * tiers.LicensePassed(p.Tiers, float64(maxes[i]), fleetR) / fleetR / steps
			m.mu.Lock()
			m.passed += uint64(pass)
			m.sel += m.offered / steps
			m.est = m.offered
			m.mu.Unlock()
			inDay += float64(uint64(pass))
			offeredDay += float64(m.offered / steps)
		}
	}
	t.Logf("the day: %d windows, offered %.0f (%.2f × per_day), passed %.0f = %.4f × per_day; the pacer was behind in %d of %d steps",
		windows, offeredDay, offeredDay/perDay, inDay, inDay/perDay, behind, windows*steps)
	if math.Abs(inDay/perDay-1) > 0.01 {
		t.Errorf("the fleet passed %.4f × per_day in the day; want within 1 %%", inDay/perDay)
	}
	if offeredDay < 1.9*perDay {
		t.Errorf("offered %.2f × per_day; the test means 2 ×", offeredDay/perDay)
	}
	// Every byte passed is in the store's days, once: the last window's,
	// added after the day's end, in the next day's key.
	var all uint64
	for _, m := range ms {
		m.mu.Lock()
		all += m.passed
		m.mu.Unlock()
	}
	rc := redis.NewClient(&redis.Options{Addr: rd.Addrs[0]})
	defer rc.Close()
	var stored uint64
	for deadline := time.Now().Add(3 * time.Second); ; {
		stored = 0
		ks, err := rc.Keys(ctx, "{tierlimit:fleet:licday}:lic:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			n, _ := rc.HGet(ctx, k, "total").Uint64()
			stored += n
		}
		if stored == all || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if stored != all {
		t.Errorf("the store's days hold %d bytes; the members passed %d", stored, all)
		ks, _ := rc.Keys(ctx, "{tierlimit:fleet:licday}:lic:*").Result()
		for _, k := range ks {
			t.Logf("%s: %v", k, rc.HGetAll(ctx, k).Val())
		}
		for i, m := range ms {
			t.Logf("member %d passed %d", i, m.passed)
		}
	}
	for i, g := range gs {
		s := g.Snapshot()
		t.Logf("member %d: guard day %v spent %d own %d members %d max %d", i, s.DayStart, s.Spent, s.Own, s.Members, s.Max)
	}
}
