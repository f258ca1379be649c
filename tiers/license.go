package tiers

import (
	"errors"
	"fmt"
	"math/bits"
	"time"
	// The zone database is embedded, so that a license's zone resolves on
	// a host without /usr/share/zoneinfo (a distroless container).
	_ "time/tzdata"
)

// ErrLicense: the license block (docs/design.md §13) is inconsistent: a
// per_day of 0, a zone that is not an IANA zone, a day_starts that is not
// HH:MM, a warn_at outside 1..99 %, a burst window of 0 or longer than a
// day, a burst max under 1×, or a license on a policy that counts packets.
var ErrLicense = errors.New("bad license")

// MaxBurstWindow is the longest license burst window: a day.
const MaxBurstWindow = 24 * time.Hour

// DefaultWarnAt is the license's warn_at when the block leaves it out.
var DefaultWarnAt = Pct(80)

// License is a SIEM's ingest license (`license:`, docs/design.md §13): a
// volume of syslog payload bytes per license day, the day starting at
// DayStarts on the license manager's clock in Zone. The agent paces each
// window's byte budget on it (LicensePace).
type License struct {
	// PerDay is the day's volume, bytes (> 0).
	PerDay uint64
	// DayStarts is when the day starts, as a time of day (0 ≤ DayStarts <
	// 24h, whole minutes), on the wall clock of Zone.
	DayStarts time.Duration
	// Zone is the IANA zone of the license manager's clock; ZoneName its
	// name as written. A nil Zone is UTC.
	Zone     *time.Location
	ZoneName string
	// WarnAt is the share of PerDay whose passing is warned of (1..99 %).
	WarnAt Percent
	// Burst, when Window > 0, caps the bytes passed in any rolling Window
	// at BurstMax × the day's average rate (PerDay ÷ the day's length).
	Burst LicenseBurst
}

// LicenseBurst is the license's optional rolling cap (`burst:`): at most
// Max × (PerDay ÷ day length) × Window bytes pass in any Window.
type LicenseBurst struct {
	// Window is the rolling window (0: no burst cap; at most a day).
	Window time.Duration
	// Max is the cap's multiple of the day's average rate, as a percent
	// (3x is 300 %; at least 100 %).
	Max Percent
}

// Clone returns a copy of l (nil for nil); a *time.Location is shared,
// it is immutable.
func (l *License) Clone() *License {
	if l == nil {
		return nil
	}
	c := *l
	return &c
}

// zone returns l's zone, UTC when none is set.
func (l *License) zone() *time.Location {
	if l.Zone == nil {
		return time.UTC
	}
	return l.Zone
}

// validate checks l against docs/design.md §13; countsBytes says whether
// the policy counts bytes (a license needs count: bytes). Returns a
// *ConfigError wrapping ErrLicense, naming the key and the value.
func (l *License) validate(countsBytes bool) error {
	if l == nil {
		return nil
	}
	if l.PerDay == 0 {
		return configErr("license.per_day", "0", ErrLicense, "want a volume of more than 0 bytes, such as 500GB")
	}
	if l.DayStarts < 0 || l.DayStarts >= 24*time.Hour || l.DayStarts%time.Minute != 0 {
		return configErr("license.day_starts", l.DayStarts.String(), ErrLicense, `want a time of day HH:MM, such as "00:00"`)
	}
	if l.WarnAt.micro < microPerPercent || l.WarnAt.micro > 99*microPerPercent {
		return configErr("license.warn_at", l.WarnAt.String(), ErrLicense, "want a percent from 1%% to 99%%")
	}
	if l.Burst.Window < 0 || l.Burst.Window > MaxBurstWindow {
		return configErr("license.burst.window", l.Burst.Window.String(), ErrLicense, "want a duration of more than 0 and at most a day (24h)")
	}
	if l.Burst.Window > 0 && l.Burst.Max.micro < microHundred {
		return configErr("license.burst.max", formatMicro(l.Burst.Max.micro/100)+"x", ErrLicense, "want a multiple of the day's average rate of at least 1x, such as 3x")
	}
	if !countsBytes {
		return configErr("license", "", ErrLicense, "a license is a volume of bytes: set count: bytes (the policy's count is packets)")
	}
	return nil
}

// LicenseDay is one license day: [Start, End) in the license's zone.
// Its length is 24 h but on the days a DST change falls in: 23 h or 25 h
// (or what the zone's change makes it).
type LicenseDay struct {
	Start, End time.Time
}

// Len returns the day's length.
func (d LicenseDay) Len() time.Duration { return d.End.Sub(d.Start) }

// Contains says whether t is in the day.
func (d LicenseDay) Contains(t time.Time) bool { return !t.Before(d.Start) && t.Before(d.End) }

// DayOf returns the license day that holds t: it starts at the last
// day_starts on the wall clock of the zone at or before t (docs/design.md
// §13). A day_starts that a DST change skips on some date (inside the
// spring-forward gap) starts that day at the change itself, the first
// instant the clock shows a later time; one that it repeats (inside the
// fall-back overlap) starts the day at its first occurrence. So every day
// is one contiguous interval, and the days tile time.
func (l *License) DayOf(t time.Time) LicenseDay {
	loc := l.zone()
	lt := t.In(loc)
	y, m, d := lt.Date()
	start := l.startOn(y, m, d)
	if t.Before(start) {
		start = l.startOn(y, m, d-1)
		d--
	}
	return LicenseDay{Start: start, End: l.startOn(y, m, d+1)}
}

// startOn returns the instant the day of date y-m-d (normalised as
// time.Date does) starts, by DayOf's rule.
func (l *License) startOn(y int, m time.Month, d int) time.Time {
	loc := l.zone()
	hh, mm := int(l.DayStarts/time.Hour), int(l.DayStarts%time.Hour/time.Minute)
	// The wall time as if it were UTC, and the zone's offsets around it.
	wall := time.Date(y, m, d, hh, mm, 0, 0, time.UTC)
	_, before := wall.Add(-26 * time.Hour).In(loc).Zone()
	_, after := wall.Add(26 * time.Hour).In(loc).Zone()
	var first time.Time
	for _, off := range []int{before, after} {
		u := wall.Add(-time.Duration(off) * time.Second)
		if sameWall(u.In(loc), wall) && (first.IsZero() || u.Before(first)) {
			first = u
		}
	}
	if !first.IsZero() {
		return first.In(loc)
	}
	// In a gap: the change is between the instants the two offsets give;
	// find the first instant at the later offset.
	lo, hi := wall.Add(-time.Duration(after)*time.Second), wall.Add(-time.Duration(before)*time.Second)
	if hi.Before(lo) {
		lo, hi = hi, lo
	}
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2)
		if _, off := mid.In(loc).Zone(); off == before {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi.Truncate(time.Second).In(loc)
}

// sameWall says whether t shows wall time w (w's fields, read as UTC).
func sameWall(t, w time.Time) bool {
	y, m, d := t.Date()
	wy, wm, wd := w.Date()
	return y == wy && m == wm && d == wd && t.Hour() == w.Hour() && t.Minute() == w.Minute() && t.Second() == w.Second()
}

// Average returns the day's average rate over window w: PerDay × w ÷ the
// day's length, bytes (at least 1).
func (l *License) Average(day LicenseDay, w time.Duration) uint64 {
	return max(1, mulDiv(l.PerDay, uint64(w), uint64(day.Len())))
}

// BurstCap returns the bytes the burst cap lets pass in any rolling
// burst window of day: Burst.Max × PerDay × Burst.Window ÷ the day's
// length; 0 without a burst cap.
func (l *License) BurstCap(day LicenseDay) uint64 {
	if l.Burst.Window <= 0 {
		return 0
	}
	avg := mulDiv(l.PerDay, uint64(l.Burst.Window), uint64(day.Len()))
	return mulDiv(avg, uint64(l.Burst.Max.micro), microHundred)
}

// String returns the license as `check` prints it.
func (l *License) String() string {
	s := fmt.Sprintf("per_day=%s day_starts=%02d:%02d zone=%s warn_at=%s", formatLicenseBytes(l.PerDay),
		int(l.DayStarts/time.Hour), int(l.DayStarts%time.Hour/time.Minute), l.zone(), l.WarnAt)
	if l.Burst.Window > 0 {
		s += fmt.Sprintf(" burst={window: %s, max: %sx}", l.Burst.Window, formatMicro(l.Burst.Max.micro/100))
	}
	return s
}

// mulDiv returns a × b ÷ c without overflow for the ranges a license
// holds (a, b < 2^63; c > 0), rounded down.
func mulDiv(a, b, c uint64) uint64 {
	if c == 0 {
		return 0
	}
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return ^uint64(0)
	}
	q, _ := bits.Div64(hi, lo, c)
	return q
}

// countsBytes says whether p counts bytes (count: bytes), which a
// license needs.
func (p Policy) countsBytes() bool { return p.Count == CountBytes }
