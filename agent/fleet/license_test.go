package fleet_test

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// ledger stands where the license guard stands (agent/license): bytes
// the test passes, the spend it hands over and the acks it gets back, and
// what the controller tells it.
type ledger struct {
	mu            sync.Mutex
	passed, acked uint64
	taking        bool // a TakeSpend not yet acked
	spent         []spentCall
	unreachable   int
	bad           string // a call out of order
}

type spentCall struct {
	day     time.Time
	total   uint64
	members int
}

func (l *ledger) pass(n uint64) {
	l.mu.Lock()
	l.passed += n
	l.mu.Unlock()
}

func (l *ledger) TakeSpend() (uint64, func(bool)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.taking {
		l.bad = "TakeSpend before the last one's ack"
	}
	l.taking = true
	p := l.passed
	return p - l.acked, func(ok bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.taking {
			l.bad = "ack twice"
		}
		l.taking = false
		if ok {
			l.acked = p
		}
	}
}

func (l *ledger) FleetSpent(day time.Time, total uint64, members int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spent = append(l.spent, spentCall{day, total, members})
}

func (l *ledger) Unreachable() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unreachable++
}

// last is the last FleetSpent call, and how many came.
func (l *ledger) last() (spentCall, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.spent) == 0 {
		return spentCall{}, 0
	}
	return l.spent[len(l.spent)-1], len(l.spent)
}

func (l *ledger) state() (passed, acked uint64, unreachable int, bad string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.passed, l.acked, l.unreachable, l.bad
}

// days is a license of days of length d aligned to Unix time 0 in UTC.
func days(d time.Duration) func(time.Time) (time.Time, time.Time, time.Time) {
	return func(t time.Time) (time.Time, time.Time, time.Time) {
		s := t.UTC().Truncate(d)
		return s, s.Add(d), s
	}
}

// licMember joins a member whose ledger is l, with days of length d.
func licMember(t *testing.T, store, name, member string, l *ledger, d time.Duration) *member {
	t.Helper()
	cfg := testConfig(store, name, member)
	cfg.License = &fleet.License{Ledger: l, Day: days(d)}
	return join(t, cfg, 100)
}

// settled waits until every ledger has had all it passed acknowledged and
// was told a total of want with the day's start, and the store's key
// holds want.
func settled(t *testing.T, c *redis.Client, name string, want uint64, day func(time.Time) (time.Time, time.Time, time.Time), ls ...*ledger) {
	t.Helper()
	for i, l := range ls {
		ok := waitFor(30, func() bool {
			p, a, _, _ := l.state()
			s, _ := l.last()
			return p == a && s.total == want
		})
		if !ok {
			p, a, _, bad := l.state()
			s, n := l.last()
			t.Errorf("ledger %d: passed %d, acked %d, last told %d of %d calls (day %v, %d members); want all acked and %d (%s)",
				i, p, a, s.total, n, s.day, s.members, want, bad)
		}
	}
	s, _ := ls[0].last()
	start, end, _ := day(s.day)
	key := "{tierlimit:fleet:" + name + "}:lic:" + start.Format("2006-01-02")
	if end.Sub(start) < 20*time.Hour {
		key = "{tierlimit:fleet:" + name + "}:lic:" + start.Format("2006-01-02T15:04:05.000Z07:00")
	}
	if got, err := c.HGet(context.Background(), key, "total").Uint64(); err != nil || got != want {
		t.Errorf("store %s total: %d (%v); want %d", key, got, err, want)
	}
}

// TestFleetLicenseShared: three members' bytes add up to one day's total
// in the store, which each member's ledger is told, with three members,
// and every byte passed is acknowledged once.
func TestFleetLicenseShared(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	ls := []*ledger{{}, {}, {}}
	for i, l := range ls {
		licMember(t, r.URL(), "lic", string(rune('a'+i)), l, 24*time.Hour)
	}
	var sum uint64
	for range 20 {
		for i, l := range ls {
			n := uint64(1000 * (i + 1))
			l.pass(n)
			sum += n
		}
		time.Sleep(testReport / 3)
	}
	settled(t, c, "lic", sum, days(24*time.Hour), ls...)
	// status --license reads the same day from the store, no member
	// needed: the total and each member's part of it.
	d, err := fleet.LicenseStatus(context.Background(), testConfig(r.URL(), "lic", ""), fleet.License{Day: days(24 * time.Hour)})
	if err != nil {
		t.Fatalf("LicenseStatus: %v", err)
	}
	var parts uint64
	for _, m := range d.Members {
		parts += m.Bytes
	}
	if d.Total != sum || len(d.Members) != 3 || d.Members[0].Name != "c" || parts != sum || !d.Start.Equal(time.Now().Truncate(24*time.Hour)) {
		t.Errorf("LicenseStatus: %+v; want total %d today, c busiest of 3 members", d, sum)
	}
	for i, l := range ls {
		s, _ := l.last()
		if s.members != 3 || !s.day.Equal(time.Now().Truncate(24*time.Hour)) {
			t.Errorf("ledger %d: told %d members, day %v; want 3 and today", i, s.members, s.day)
		}
		if _, _, u, bad := l.state(); u != 0 || bad != "" {
			t.Errorf("ledger %d: unreachable %d times (%s); want none", i, u, bad)
		}
	}
}

// TestFleetLicenseDayRolls: over days of one second, each ledger is told
// the day the store's clock is in, the totals restart with each day, and
// the days' final totals sum to every byte passed.
func TestFleetLicenseDayRolls(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	const day = time.Second
	ls := []*ledger{{}, {}}
	for i, l := range ls {
		licMember(t, r.URL(), "roll", string(rune('a'+i)), l, day)
	}
	var sum uint64
	end := time.Now().Add(3500 * time.Millisecond)
	for time.Now().Before(end) {
		for _, l := range ls {
			l.pass(100)
			sum += 100
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(5 * testReport)
	starts := map[time.Time]bool{}
	for i, l := range ls {
		l.mu.Lock()
		var prev spentCall
		for _, s := range l.spent {
			starts[s.day] = true
			if s.day.Before(prev.day) || (s.day.Equal(prev.day) && s.total < prev.total) {
				t.Errorf("ledger %d: told day %v total %d after day %v total %d", i, s.day, s.total, prev.day, prev.total)
			}
			if s.day.Truncate(day) != s.day {
				t.Errorf("ledger %d: day start %v is not a day's", i, s.day)
			}
			prev = s
		}
		l.mu.Unlock()
		if p, a, _, bad := l.state(); p != a || bad != "" {
			t.Errorf("ledger %d: passed %d, acked %d (%s)", i, p, a, bad)
		}
	}
	if len(starts) < 3 {
		t.Fatalf("the ledgers were told %d days; want 3 or more over 3.5 s of 1 s days", len(starts))
	}
	var got uint64
	for s := range starts {
		n, err := c.HGet(context.Background(), "{tierlimit:fleet:roll}:lic:"+s.UTC().Format("2006-01-02T15:04:05.000Z"), "total").Uint64()
		if err != nil {
			t.Fatalf("day %v: %v", s, err)
		}
		got += n
	}
	if got != sum {
		t.Errorf("the days hold %d bytes; %d were passed", got, sum)
	}
}

// TestFleetLicensePartition: the store stopped mid-day (SIGSTOP: the
// reports in flight hang, their connections are dropped with commands
// unread) puts every member's ledger out of reach once, after ttl; bytes
// passed meanwhile are added when the store comes back, and the day's
// total is every byte passed: none lost, none counted twice (the reports
// abandoned in the socket run when the store resumes).
func TestFleetLicensePartition(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	ls := []*ledger{{}, {}, {}}
	for i, l := range ls {
		licMember(t, r.URL(), "part", string(rune('a'+i)), l, 24*time.Hour)
	}
	var sum uint64
	passFor := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			for _, l := range ls {
				l.pass(50)
				sum += 50
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	passFor(500 * time.Millisecond)
	before, _ := ls[0].last()
	r.Signal(t, syscall.SIGSTOP)
	stopped := true
	t.Cleanup(func() {
		if stopped {
			r.Signal(t, syscall.SIGCONT)
		}
	})
	passFor(testTTL + 5*testReport)
	for i, l := range ls {
		if _, _, u, _ := l.state(); u != 1 {
			t.Errorf("ledger %d: unreachable %d times after ttl with the store stopped; want once", i, u)
		}
	}
	r.Signal(t, syscall.SIGCONT)
	stopped = false
	passFor(500 * time.Millisecond)
	settled(t, c, "part", sum, days(24*time.Hour), ls...)
	if after, _ := ls[0].last(); after.total <= before.total || !after.day.Equal(before.day) {
		t.Errorf("after the store came back: day %v total %d; before it stopped %v %d", after.day, after.total, before.day, before.total)
	}
	for i, l := range ls {
		if _, _, u, bad := l.state(); u != 1 || bad != "" {
			t.Errorf("ledger %d: unreachable %d times (%s); want once", i, u, bad)
		}
	}
}

// TestFleetLicenseACL: members logged in as the ACL user limited to their
// fleet's keys and the scripts' commands (fleetACL, docs/operations.md)
// add to the license's day and read it back (LicenseStatus): the license
// needs no command more.
func TestFleetLicenseACL(t *testing.T) {
	r, store, pf := aclStore(t)
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	ls := []*ledger{{}, {}}
	for i, l := range ls {
		cfg := testConfig(store, "acl", string(rune('a'+i)))
		cfg.PasswordFile = pf
		cfg.License = &fleet.License{Ledger: l, Day: days(24 * time.Hour)}
		join(t, cfg, 10)
		l.pass(700)
	}
	settled(t, c, "acl", 1400, days(24*time.Hour), ls...)
	cfg := testConfig(store, "acl", "")
	cfg.PasswordFile = pf
	if d, err := fleet.LicenseStatus(context.Background(), cfg, fleet.License{Day: days(24 * time.Hour)}); err != nil || d.Total != 1400 {
		t.Errorf("LicenseStatus as the ACL user: %+v, %v; want a total of 1400", d, err)
	}
}

// TestFleetLicenseCluster: on a Redis Cluster of 3 masters the day's keys
// share the fleet's hash slot, so the report script reaches them with
// the entries (a script over several slots fails), and LicenseStatus
// reads the day back.
func TestFleetLicenseCluster(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Cluster: 3})
	ls := []*ledger{{}, {}, {}}
	for i, l := range ls {
		licMember(t, r.URL(), "clu", string(rune('a'+i)), l, 24*time.Hour)
		l.pass(uint64(100 * (i + 1)))
	}
	ok := waitFor(30, func() bool {
		for _, l := range ls {
			if s, _ := l.last(); s.total != 600 {
				return false
			}
		}
		return true
	})
	if !ok {
		s, n := ls[0].last()
		t.Fatalf("ledger a told %d in %d calls; want 600", s.total, n)
	}
	d, err := fleet.LicenseStatus(context.Background(), testConfig(r.URL(), "clu", ""), fleet.License{Day: days(24 * time.Hour)})
	if err != nil || d.Total != 600 || len(d.Members) != 3 {
		t.Errorf("LicenseStatus on the cluster: %+v, %v; want 600 from 3 members", d, err)
	}
}

// TestFleetLicenseBadDays: a day function that does not tile time (here
// one day for all time, which the day after cannot follow) adds nothing,
// says so once as an ERROR, and leaves the fleet's sharing as it is: the
// script is never handed days it would refuse.
func TestFleetLicenseBadDays(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	l := &ledger{}
	l.pass(100)
	cfg := testConfig(r.URL(), "bad", "a")
	epoch := time.Unix(0, 0)
	cfg.License = &fleet.License{Ledger: l, Day: func(time.Time) (time.Time, time.Time, time.Time) {
		return epoch, epoch.Add(100 * 365 * 24 * time.Hour), epoch
	}}
	a := join(t, cfg, 100)
	b := join(t, testConfig(r.URL(), "bad", "b"), 50)
	shares(t, 20, a, b)
	if _, n := l.last(); n != 0 {
		t.Errorf("the ledger was told %d totals; want none", n)
	}
	if p, acked, _, _ := l.state(); acked != 0 || p != 100 {
		t.Errorf("acked %d of %d; want nothing added", acked, p)
	}
	if n := strings.Count(a.log.String(), "do not follow each other"); n != 1 {
		t.Errorf("the bad days said %d times; want once:\n%s", n, a.log)
	}
}

// TestFleetLicenseReload: a reload that gives the member a license (a
// policy that gains license:) adds its spend from the next report on;
// one that takes it away stops the adds, the ledger keeping what it
// passed since.
func TestFleetLicenseReload(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	cfg := testConfig(r.URL(), "rel", "a")
	m := join(t, cfg, 10)
	l := &ledger{}
	l.pass(300)
	cfg.License = &fleet.License{Ledger: l, Day: days(24 * time.Hour)}
	if err := m.c.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	settled(t, c, "rel", 300, days(24*time.Hour), l)
	cfg.License = nil
	if err := m.c.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * testReport) // a report in flight may still carry an add
	_, n := l.last()
	l.pass(200)
	time.Sleep(5 * testReport)
	if _, n2 := l.last(); n2 != n {
		t.Errorf("the ledger was told %d totals more after the license went away", n2-n)
	}
	if p, acked, _, _ := l.state(); p != 500 || acked != 300 {
		t.Errorf("passed %d, acked %d; want 500 and 300", p, acked)
	}
}
