package fleet

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// shortDays is a license of days of length d, aligned to Unix time 0 in
// UTC: a test's compressed day.
func shortDays(d time.Duration) *License {
	return &License{Day: func(t time.Time) (time.Time, time.Time, time.Time) {
		s := t.UTC().Truncate(d)
		return s, s.Add(d), s
	}}
}

// licReport runs one report of member m with the add a on fleet name.
func licReport(t *testing.T, c redis.UniversalClient, name, m string, a *licenseAdd) view {
	t.Helper()
	e := entry{Member: m, Instance: "00000000000000aa", Est: Sums{In: 1, Total: 1}, TTL: time.Second,
		Report: 100 * time.Millisecond, Window: time.Second, Max: 1000, Digest: "ab", Lic: a}
	v, err := report(context.Background(), c, name, e)
	if err != nil {
		t.Fatalf("report seq %d: %v", a.Seq, err)
	}
	if v.lic == nil {
		t.Fatalf("report seq %d: no license answer", a.Seq)
	}
	return v
}

// TestLicenseScriptAdds: the report script adds each instance's bytes to
// the day the store's clock is in and returns the day's total; an add
// whose answer was lost is counted once when its bytes come again in the
// next add, and a report overtaken by a later one adds nothing.
func TestLicenseScriptAdds(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	l := shortDays(time.Hour) // no boundary within the test, but for an hour's bad luck: checked below
	days := l.days(time.Now())
	add := func(seq, acked, d uint64) *licenseAdd {
		return &licenseAdd{Seq: seq, Acked: acked, D: d, Days: days, Keep: time.Minute}
	}
	type step struct {
		name           string
		seq, acked, d  uint64
		want, wantMine uint64
	}
	for _, s := range []step{
		{"first add", 1, 0, 100, 100, 100},
		{"its answer lost: its bytes again with 50 more", 2, 0, 150, 150, 150},
		{"answered: 30 new", 3, 2, 30, 180, 180},
		{"the lost report itself, overtaken, arrives late", 2, 0, 150, 180, 180},
		{"the same report twice", 3, 2, 30, 180, 180},
		{"two lost answers in a row", 4, 3, 10, 190, 190},
		{"", 5, 3, 25, 205, 205},
		{"answered at last", 6, 3, 40, 220, 220},
	} {
		v := licReport(t, c, "lic", "a", add(s.seq, s.acked, s.d))
		if v.lic.day != 1 || v.lic.total != s.want {
			t.Errorf("%s (seq %d acked %d d %d): day %d total %d; want day 1 total %d", s.name, s.seq, s.acked, s.d, v.lic.day, v.lic.total, s.want)
		}
		if got, _ := c.HGet(context.Background(), dayKey("lic", days[1]), "a#00000000000000aa").Result(); got == "" ||
			got[len(got)-len(strconv.FormatUint(s.wantMine, 10)):] != strconv.FormatUint(s.wantMine, 10) {
			t.Errorf("%s: the instance's record %q; want its spend %d", s.name, got, s.wantMine)
		}
	}
	// Another member's adds go to the same total.
	v := licReport(t, c, "lic", "b", add(1, 0, 1000))
	if v.lic.total != 1220 {
		t.Errorf("b's add: total %d; want 1220", v.lic.total)
	}
	if ttl := c.PTTL(context.Background(), dayKey("lic", days[1])).Val(); ttl <= time.Minute || ttl > time.Minute+time.Hour {
		t.Errorf("the day's key lives %v; want the rest of its day + a minute", ttl)
	}
	// A total that is not a number is rebuilt from the instances' spend.
	c.HSet(context.Background(), dayKey("lic", days[1]), "total", "garbage")
	if v := licReport(t, c, "lic", "b", add(2, 1, 5)); v.lic.total != 1225 {
		t.Errorf("after a corrupt total: %d; want 1225 rebuilt from the records", v.lic.total)
	}
	// Days that hold not the store's clock: nothing is added, the
	// store's time comes back.
	past := l.days(time.Now().Add(-10 * time.Hour))
	a := &licenseAdd{Seq: 3, Acked: 2, D: 7, Days: past, Keep: time.Minute}
	if v := licReport(t, c, "lic", "b", a); v.lic.day != -1 || time.Since(v.lic.now).Abs() > time.Minute {
		t.Errorf("days 10 h ago: day %d, store time %v; want -1 and now", v.lic.day, v.lic.now)
	}
	if n := c.Exists(context.Background(), dayKey("lic", past[0]), dayKey("lic", past[1]), dayKey("lic", past[2])).Val(); n != 0 {
		t.Errorf("days the store is not in: %d keys written", n)
	}
}

// TestLicenseScriptDayRolls: adds of two members across days of 500 ms
// each land in the day the store's TIME is in, whatever the days the
// member passed (one of three); the days' totals sum to the bytes added.
func TestLicenseScriptDayRolls(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	l := shortDays(500 * time.Millisecond)
	seq := map[string]uint64{}
	var sum uint64
	seen := map[time.Time]uint64{}
	deadline := time.Now().Add(1600 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		m := []string{"a", "b"}[i%2]
		// Member b estimates the store's clock 400 ms ahead: its days
		// are not the store's, but one of its three is.
		at := time.Now()
		if m == "b" {
			at = at.Add(400 * time.Millisecond)
		}
		seq[m]++
		days := l.days(at)
		a := &licenseAdd{Seq: seq[m], Acked: seq[m] - 1, D: 10, Days: days, Keep: time.Minute}
		v := licReport(t, c, "roll", m, a)
		if v.lic.day < 0 {
			t.Fatalf("report %d: the store's time %v in none of %v", i, v.lic.now, days)
		}
		d := days[v.lic.day]
		if v.lic.now.Before(d.start) || !v.lic.now.Before(d.end) {
			t.Errorf("report %d: added to [%v, %v) at the store's %v", i, d.start, d.end, v.lic.now)
		}
		sum += 10
		seen[d.start] = v.lic.total
		time.Sleep(5 * time.Millisecond)
	}
	if len(seen) < 3 {
		t.Fatalf("the adds spanned %d days; want 3 or more", len(seen))
	}
	var got uint64
	for s := range seen {
		n, err := c.HGet(context.Background(), dayKey("roll", span{s, s.Add(500 * time.Millisecond), s}), "total").Uint64()
		if err != nil {
			t.Fatalf("day %v: %v", s, err)
		}
		got += n
	}
	if got != sum {
		t.Errorf("the days hold %d bytes; %d were added", got, sum)
	}
}

// hostLedger is a ledger that records what the controller tells it.
type hostLedger struct {
	mu     sync.Mutex
	passed uint64
	acked  uint64
	days   []time.Time
	totals []uint64
}

func (l *hostLedger) TakeSpend() (uint64, func(bool)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.passed
	return p - l.acked, func(ok bool) {
		if ok {
			l.mu.Lock()
			l.acked = p
			l.mu.Unlock()
		}
	}
}

func (l *hostLedger) FleetSpent(day time.Time, total uint64, _ int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.days, l.totals = append(l.days, day), append(l.totals, total)
}

func (*hostLedger) Unreachable() {}

// TestLicenseHostClockOff: a member whose clock is three days ahead
// adds nothing at its first report (the store's clock is in none of its
// days) and, from the store's TIME in that answer, adds to the store's
// day from its second on: the day is the store's, never the member's.
func TestLicenseHostClockOff(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	hostNow = func() time.Time { return time.Now().Add(72 * time.Hour) }
	defer func() { hostNow = time.Now }()
	l := &hostLedger{passed: 500}
	lic := shortDays(24 * time.Hour)
	lic.Ledger = l
	ctl, err := Start(Config{Name: "skew", Member: "a", Store: "redis://" + r.Addrs[0], Max: 1000,
		Report: 50 * time.Millisecond, TTL: time.Second, License: lic}, nopLimiter{}, nopFallback{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		l.mu.Lock()
		n, acked := len(l.days), l.acked
		l.mu.Unlock()
		if n > 0 && acked == 500 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	if len(l.days) == 0 || !l.days[0].Equal(today) || l.totals[0] != 500 || l.acked != 500 {
		t.Fatalf("told days %v totals %v, acked %d; want today %v, 500, 500", l.days, l.totals, l.acked, today)
	}
	if n := c.Exists(context.Background(), dayKey("skew", lic.days(hostNow())[1])).Val(); n != 0 {
		t.Errorf("the member's own (wrong) day was written")
	}
}

// nopLimiter is a program with no traffic; nopFallback an agent that
// takes the fallback as it comes.
type nopLimiter struct{}

func (nopLimiter) FleetEstimate() (uint64, uint64, error) { return 0, 0, nil }
func (nopLimiter) SetFleetOthers(uint64, uint64) error    { return nil }

type nopFallback struct{}

func (nopFallback) EnterFallback(int) error { return nil }
func (nopFallback) LeaveFallback() error    { return nil }

// BenchmarkFleetReportLicense: the report script's time as the server
// counts it (INFO commandstats, µs per call), without and with the
// license's add (the day's record read, the record and the total written
// in one HSET), in alternating chunks of 500 reports on one store: on a
// busy host the least chunk of each stands for it, and their ratio is
// reported (license/plain).
func BenchmarkFleetReportLicense(b *testing.B) {
	r := testenv.StartRedis(b, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addrs[0]})
	defer c.Close()
	l := shortDays(24 * time.Hour)
	ctx := context.Background()
	var seq uint64
	one := func(lic bool) error {
		e := entry{Member: "m", Instance: "00000000000000aa", Est: Sums{In: 500, Total: 1000}, TTL: time.Second,
			Report: 100 * time.Millisecond, Window: time.Second, Max: 1000, Digest: "ab"}
		if lic {
			seq++
			e.Lic = &licenseAdd{Seq: seq, Acked: seq - 1, D: 1500, Days: l.days(time.Now()), Keep: time.Minute}
		}
		_, err := report(ctx, c, "bench", e)
		return err
	}
	perCall := func() float64 {
		info := c.Info(ctx, "commandstats").Val()
		i := strings.Index(info, "cmdstat_evalsha:")
		if i < 0 {
			return 0
		}
		j := strings.Index(info[i:], "usec_per_call=")
		var us float64
		fmt.Sscanf(info[i+j+len("usec_per_call="):], "%f", &us)
		return us
	}
	const chunk = 500
	for _, lic := range []bool{false, true} {
		for range 50 {
			one(lic)
		}
	}
	best := [2]float64{math.Inf(1), math.Inf(1)}
	b.ResetTimer()
	for n := 0; n < b.N; n += 2 * chunk {
		for k, lic := range []bool{false, true} {
			c.ConfigResetStat(ctx)
			for range chunk {
				if err := one(lic); err != nil {
					b.Fatal(err)
				}
			}
			best[k] = min(best[k], perCall())
		}
	}
	b.StopTimer()
	b.ReportMetric(best[0], "plain-script-µs")
	b.ReportMetric(best[1], "license-script-µs")
	b.ReportMetric(best[1]/best[0], "ratio")
}

// TestLicenseDaysDST: the three days around a DST change in the
// license's zone (tiers.License.DayOf) tile time, the change's day 23 h
// long, and each day's key is its start's date in the zone.
func TestLicenseDaysDST(t *testing.T) {
	p, err := tiers.ParseYAML([]byte("count: bytes\nmax: 1MB\nlicense: {per_day: 1GB, zone: America/Chicago}\n"))
	if err != nil {
		t.Fatal(err)
	}
	l := &License{Day: func(t time.Time) (time.Time, time.Time, time.Time) {
		d := p.License.DayOf(t)
		return d.Start, d.End, d.Start
	}}
	chicago, _ := time.LoadLocation("America/Chicago")
	days := l.days(time.Date(2026, 3, 8, 12, 0, 0, 0, chicago))
	wantLen := []time.Duration{24 * time.Hour, 23 * time.Hour, 24 * time.Hour}
	for i, d := range days {
		if got := d.end.Sub(d.start); got != wantLen[i] {
			t.Errorf("day %d: %v long; want %v", i, got, wantLen[i])
		}
		if i > 0 && !days[i-1].end.Equal(d.start) {
			t.Errorf("day %d starts at %v, the day before ends at %v", i, d.start, days[i-1].end)
		}
		if want := "{tierlimit:fleet:f}:lic:2026-03-0" + string(rune('7'+i)); dayKey("f", d) != want {
			t.Errorf("day %d key %q; want %q", i, dayKey("f", d), want)
		}
	}
}
