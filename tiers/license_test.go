package tiers

import (
	"testing"
	"time"
)

func chicago(t *testing.T) *License {
	t.Helper()
	loc, err := time.LoadLocation("America/Chicago")
	if err != nil {
		t.Fatal(err)
	}
	return &License{PerDay: 500e9, Zone: loc, ZoneName: "America/Chicago", WarnAt: Pct(80)}
}

func TestParseLicenseInvalid(t *testing.T) {
	const pre = "max: 1000\nlicense:\n"
	for _, c := range []struct {
		src  string
		want error
		key  string
		line int
	}{
		{pre + "  per_day: 500GB\n  zone: Mars/Olympus", ErrLicense, "license.zone", 4},
		{pre + "  per_day: 500GB\n  zone: Local", ErrLicense, "license.zone", 4},
		{pre + "  per_day: 0", ErrLicense, "license.per_day", 3},
		{pre + "  per_day: lots", ErrType, "license.per_day", 3},
		{pre + "  per_day: 500GB\n  warn_at: 120%", ErrLicense, "license.warn_at", 4},
		{pre + "  per_day: 500GB\n  warn_at: 0%", ErrLicense, "license.warn_at", 4},
		{pre + "  per_day: 500GB\n  day_starts: \"25:00\"", ErrLicense, "license.day_starts", 4},
		{pre + "  per_day: 500GB\n  day_starts: noon", ErrLicense, "license.day_starts", 4},
		{pre + "  per_day: 500GB\n  burst: {window: 25h, max: 3x}", ErrLicense, "license.burst.window", 4},
		{pre + "  per_day: 500GB\n  burst: {window: 5m, max: 0.5x}", ErrLicense, "license.burst.max", 4},
		{pre + "  per_day: 500GB\n  burst: {window: 5m, max: 3}", ErrType, "license.burst.max", 4},
		{pre + "  per_day: 500GB\n  burst: {window: 5m}", ErrMissingKey, "license.burst.max", 4},
		{pre + "  zone: UTC", ErrMissingKey, "license.per_day", 3},
		{pre + "  per_day: 500GB\n  perday: 1", ErrUnknownKey, "license.perday", 4},
		// A valid block on a policy that counts packets.
		{pre + "  per_day: 500GB", ErrLicense, "license", 3},
	} {
		_, err := ParseYAML([]byte(c.src))
		t.Run(c.src, func(t *testing.T) { checkConfigError(t, err, c.want, c.key, c.line) })
	}
}

func TestLicenseValidate(t *testing.T) {
	l := chicago(t)
	l.Burst = LicenseBurst{Window: 5 * time.Minute, Max: Pct(300)}
	if err := l.validate(true); err != nil {
		t.Fatal(err)
	}
	if got := l.String(); got != "per_day=500GB day_starts=00:00 zone=America/Chicago warn_at=80% burst={window: 5m0s, max: 3x}" {
		t.Errorf("String = %q", got)
	}
}

// TestLicenseDayDST: the days of America/Chicago's DST changes in 2026
// are 23 h (8 March) and 25 h (1 November) long, and the days tile.
func TestLicenseDayDST(t *testing.T) {
	l := chicago(t)
	loc := l.Zone
	for _, c := range []struct {
		at    time.Time
		start string
		len   time.Duration
	}{
		{time.Date(2026, 3, 8, 12, 0, 0, 0, loc), "2026-03-08T00:00:00-06:00", 23 * time.Hour},
		{time.Date(2026, 11, 1, 12, 0, 0, 0, loc), "2026-11-01T00:00:00-05:00", 25 * time.Hour},
		{time.Date(2026, 11, 1, 1, 30, 0, 0, loc), "2026-11-01T00:00:00-05:00", 25 * time.Hour},
		{time.Date(2026, 6, 1, 0, 0, 0, 0, loc), "2026-06-01T00:00:00-05:00", 24 * time.Hour},
		{time.Date(2026, 5, 31, 23, 59, 59, 0, loc), "2026-05-31T00:00:00-05:00", 24 * time.Hour},
	} {
		d := l.DayOf(c.at)
		if got := d.Start.Format(time.RFC3339); got != c.start || d.Len() != c.len {
			t.Errorf("DayOf(%s) = %s, %s long; want %s, %s", c.at, got, d.Len(), c.start, c.len)
		}
		if !d.Contains(c.at) {
			t.Errorf("DayOf(%s) = [%s, %s) does not hold it", c.at, d.Start, d.End)
		}
	}
	// The days tile a year: each starts where the last ended.
	d := l.DayOf(time.Date(2026, 1, 1, 5, 0, 0, 0, loc))
	for range 366 {
		next := l.DayOf(d.End)
		if !next.Start.Equal(d.End) || next.Len() < 23*time.Hour || next.Len() > 25*time.Hour {
			t.Fatalf("after [%s, %s) comes [%s, %s)", d.Start, d.End, next.Start, next.End)
		}
		d = next
	}
}

// TestLicenseDayStartsInGap: a day_starts of 02:30 on the spring-forward
// day starts at the change (03:00 CDT, 08:00 UTC); on the fall-back day
// 01:30 starts at its first occurrence (CDT, 06:30 UTC).
func TestLicenseDayStartsInGap(t *testing.T) {
	l := chicago(t)
	l.DayStarts = 2*time.Hour + 30*time.Minute
	d := l.DayOf(time.Date(2026, 3, 8, 12, 0, 0, 0, l.Zone))
	if want := time.Date(2026, 3, 8, 8, 0, 0, 0, time.UTC); !d.Start.Equal(want) {
		t.Errorf("gap: day starts %s, want %s", d.Start.UTC(), want)
	}
	if want := time.Date(2026, 3, 9, 7, 30, 0, 0, time.UTC); !d.End.Equal(want) {
		t.Errorf("gap: day ends %s, want %s", d.End.UTC(), want)
	}
	l.DayStarts = time.Hour + 30*time.Minute
	d = l.DayOf(time.Date(2026, 11, 1, 12, 0, 0, 0, l.Zone))
	if want := time.Date(2026, 11, 1, 6, 30, 0, 0, time.UTC); !d.Start.Equal(want) {
		t.Errorf("overlap: day starts %s, want %s", d.Start.UTC(), want)
	}
	if d.Len() != 25*time.Hour {
		t.Errorf("overlap: day is %s long, want 25h", d.Len())
	}
}

// TestLicensePace: the law's parts: the remainder paced on the time
// left, the burst caps, the floor, and the max whose expected passes at
// the offered rate are the target.
func TestLicensePace(t *testing.T) {
	l := &License{PerDay: 86_400_000, WarnAt: Pct(80), Burst: LicenseBurst{Window: time.Minute, Max: Pct(300)}}
	day := l.DayOf(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	tiers := Default().Tiers
	in := PaceInput{Day: day, Now: day.Start.Add(12 * time.Hour), Window: time.Second, Spent: 43_200_000, Offered: 2000, Tiers: tiers}
	pc := l.Pace(in)
	if pc.Target != 1000 || pc.Cap != 3000 {
		t.Fatalf("half the day spent at noon: target %d cap %d, want 1000, 3000", pc.Target, pc.Cap)
	}
	if got := LicensePassed(tiers, float64(pc.Max), 2000); got < 999.5 || got > 1001 {
		t.Errorf("max %d passes %.1f of 2000, want 1000", pc.Max, got)
	}
	// The default tiers pass 0.88 max at most: at 2x the max is 1000/0.88.
	if pc.Max < 1100 || pc.Max > 1200 {
		t.Errorf("max %d, want about 1000/0.88", pc.Max)
	}
	// Behind the pace, the target is at most the burst cap; the rolling
	// window's spend lowers it further.
	in.Spent = 0
	if pc := l.Pace(in); pc.Target != 2000 {
		t.Errorf("nothing spent at noon: target %d, want 2000", pc.Target)
	}
	in.Now = day.End.Add(-time.Second)
	if pc := l.Pace(in); pc.Target != 3000 {
		t.Errorf("last window, nothing spent: target %d, want the cap 3000", pc.Target)
	}
	in.BurstSpent = 179_000
	if pc := l.Pace(in); pc.Target != 1000 {
		t.Errorf("rolling window nearly spent: target %d, want 1000", pc.Target)
	}
	// Spent: the target is 0, the max the protected floor.
	in.BurstSpent, in.Spent, in.Protected, in.ProtectBudget = 0, l.PerDay+5, 10, Pct(5)
	if pc := l.Pace(in); pc.Target != 0 || pc.Max != 200 || pc.Floor != 200 {
		t.Errorf("spent: %+v, want target 0, max = floor = 200", pc)
	}
	// Quiet: offered under the target, a max whose passes never exceed it.
	in = PaceInput{Day: day, Now: day.Start, Window: time.Second, Offered: 10, Tiers: tiers}
	if pc := l.Pace(in); pc.Max != 1137 {
		t.Errorf("quiet: max %d, want ceil(1000/0.88) = 1137", pc.Max)
	}
}

func TestParseLicense(t *testing.T) {
	p, err := ParseYAML([]byte(`count: bytes
max: 10MB
license:
  per_day: 500GB
  day_starts: "06:30"
  zone: America/Chicago
  warn_at: 75%
  burst: {window: 5m, max: 3x}
`))
	if err != nil {
		t.Fatal(err)
	}
	l := p.License
	if l == nil || l.PerDay != 500e9 || l.DayStarts != 6*time.Hour+30*time.Minute || l.ZoneName != "America/Chicago" ||
		l.WarnAt != Pct(75) || l.Burst.Window != 5*time.Minute || l.Burst.Max != Pct(300) {
		t.Fatalf("license = %+v", l)
	}
	// Defaults: UTC, 00:00, 80 %, no burst.
	p, err = ParseYAML([]byte("count: bytes\nmax: 10MB\nlicense: {per_day: 1TiB}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := p.License; l.PerDay != 1<<40 || l.Zone != time.UTC || l.DayStarts != 0 || l.WarnAt != DefaultWarnAt || l.Burst.Window != 0 {
		t.Fatalf("defaults: %+v", l)
	}
	q := p.Clone()
	q.License.PerDay = 1
	if p.License.PerDay == 1 {
		t.Error("Clone shares the license")
	}
}

// TestEffectiveLicense: the smaller of LicenseMax and the max in force
// (the learnt max under max: auto) wins; a fleet's fleet.max is capped.
func TestEffectiveLicense(t *testing.T) {
	p, err := ParseYAML([]byte("count: bytes\nmax: 10MB\nlicense: {per_day: 1TB}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ lic, want uint64 }{{0, 10e6}, {4e6, 4e6}, {20e6, 10e6}} {
		if q, _ := Effective(p, State{LicenseMax: c.lic}); q.Max != c.want {
			t.Errorf("LicenseMax %d: max %d, want %d", c.lic, q.Max, c.want)
		}
	}
	a, err := ParseYAML([]byte("count: bytes\nmax: auto\nauto: {start: 10MB}\nlicense: {per_day: 1TB}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if q, _ := Effective(a, State{LearntMax: 3e6, LicenseMax: 4e6}); q.Max != 3e6 {
		t.Errorf("learnt 3MB, license 4MB: max %d", q.Max)
	}
	if q, _ := Effective(a, State{LearntMax: 5e6, LicenseMax: 4e6}); q.Max != 4e6 {
		t.Errorf("learnt 5MB, license 4MB: max %d", q.Max)
	}
	if p.Max != 10e6 {
		t.Error("Effective changed the given policy")
	}
}

// TestLicensePaceDSTDays: on the 23 h and 25 h days the law paces the
// day as the zone has it: the average rate is per_day over 23 h (25 h),
// and a day offered 2 × that rate, walked window by window at the tiers'
// expectation, ends at per_day (within 0.1 %) at the day's end, not an
// hour early or late.
func TestLicensePaceDSTDays(t *testing.T) {
	l := chicago(t)
	l.PerDay = 1e9
	tiers := Default().Tiers
	for _, c := range []struct {
		date time.Time
		len  time.Duration
	}{
		{time.Date(2026, 3, 8, 12, 0, 0, 0, l.Zone), 23 * time.Hour},
		{time.Date(2026, 11, 1, 12, 0, 0, 0, l.Zone), 25 * time.Hour},
	} {
		day := l.DayOf(c.date)
		w := time.Minute
		avg := l.Average(day, w)
		if want := uint64(1e9 * float64(w) / float64(c.len)); avg != want {
			t.Errorf("%s: average %d per minute, want %d", day.Start, avg, want)
		}
		var spent float64
		var at time.Time
		for now := day.Start; now.Before(day.End); now = now.Add(w) {
			pc := l.Pace(PaceInput{Day: day, Now: now, Window: w, Spent: uint64(spent), Offered: 2 * avg, Tiers: tiers})
			spent += min(LicensePassed(tiers, float64(pc.Max), float64(2*avg)), float64(2*avg))
			if at.IsZero() && spent >= 0.999e9 {
				at = now.Add(w)
			}
		}
		if spent < 0.999e9 || spent > 1.001e9 || at.Before(day.End.Add(-10*time.Minute)) {
			t.Errorf("%s (%s): spent %.0f, per_day reached at %s; want 1e9 at the day's end %s", day.Start, day.Len(), spent, at, day.End)
		}
	}
}
