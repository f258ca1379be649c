package fleet

import (
	"fmt"
	"strconv"
	"time"
)

// LicenseLedger is the license guard as the fleet controller reaches it
// (docs/design.md §12, "One license for the fleet"): agent/license's
// guard implements it, and the agent hands it over in Config.License when
// the policy has both fleet: and license:. Its methods are called from the
// report loop, one at a time, and ack from the report worker, once per
// TakeSpend and before the next TakeSpend, but possibly while the loop
// calls Unreachable (a report in flight when the member enters fallback):
// the ledger locks what they share.
type LicenseLedger interface {
	// TakeSpend returns the bytes passed since the last acknowledged add; ack(true) after the store took them.
	TakeSpend() (delta uint64, ack func(ok bool))
	// FleetSpent gives the fleet's total for the license day that starts at dayStart (the store's clock in the
	// license's zone) and the member count the store returned.
	FleetSpent(dayStart time.Time, total uint64, members int)
	// Unreachable is called when the store is out of reach: pace on the last remainder ÷ members.
	Unreachable()
}

// License is a fleet member's license: the guard it adds its spend from
// and reports the fleet's to, and the license's day.
type License struct {
	Ledger LicenseLedger
	// Day returns the license day that holds t, a time on the store's
	// clock: its bounds on that clock, [start, end), and its start as the
	// ledger and the key name it, named: the same instant as start, in
	// the license's zone (the key's date is its date there), but for a
	// test whose license clock runs faster than the store's (a compressed
	// day). The door's is tiers.License.DayOf (day_starts in the zone,
	// days of 23 and 25 hours at DST). It must be a pure function of t,
	// the same on every member, with start <= t < end.
	Day func(t time.Time) (start, end, named time.Time)
}

// maxDaySpend bounds what a day key holds, and what one report adds:
// the script's numbers are doubles, exact below 2^53 bytes (8 PiB).
const maxDaySpend = 1 << 53

// dayKeep is how long a day's key outlives the day's end: one more day of
// the same length (at least a minute), so that status --license still
// reads yesterday's total today.
func dayKeep(d span) time.Duration { return max(d.end.Sub(d.start), time.Minute) }

// hostNow is this host's clock, which a member's first add (before any
// answer) estimates the store's by; a seam for tests of a host whose
// clock is off.
var hostNow = time.Now

// span is one license day, [start, end) on the store's clock, and its
// start as the ledger names it (License.Day).
type span struct{ start, end, named time.Time }

// days returns the license days before, at and after t: the three keys a
// report may add to. The store's TIME picks one of them, so a member whose
// estimate of the store's clock is off by less than a day adds to the day
// the store is in.
func (l *License) days(t time.Time) [3]span {
	var d [3]span
	d[1].start, d[1].end, d[1].named = l.Day(t)
	d[0].start, d[0].end, d[0].named = l.Day(d[1].start.Add(-time.Nanosecond))
	d[2].start, d[2].end, d[2].named = l.Day(d[1].end)
	return d
}

// dayKey is the key of the fleet name's license day d:
// {tierlimit:fleet:NAME}:lic:YYYY-MM-DD, the date of the day's start
// (named) in the license's zone; a day shorter than 20 hours on the
// store's clock (a test's compressed day) adds the named start's time of
// day, to the ms, so that two days of one date never share a key. The hash tag
// keeps it in the slot of the fleet's other keys (one script reaches them
// on one Cluster node).
func dayKey(name string, d span) string {
	label := d.named.Format("2006-01-02")
	if d.end.Sub(d.start) < 20*time.Hour {
		label = d.named.Format("2006-01-02T15:04:05.000Z07:00")
	}
	return "{tierlimit:fleet:" + name + "}:lic:" + label
}

// licenseAdd is what one report adds to the fleet's day: the instance's
// report sequence number Seq, the last one the store acknowledged Acked (0
// for none), the bytes passed since that acknowledgement D (the ledger's
// TakeSpend), and the three days the store's TIME picks from. The script
// adds D less what a report after Acked already added (a report whose
// answer was lost), so a retried add is never counted twice.
type licenseAdd struct {
	Seq, Acked, D uint64
	Days          [3]span
	Keep          time.Duration
	ack           func(ok bool)
}

// arg is the add as the script's ARGV[10] reads it:
// "SEQ ACKED D B0 B1 B2 B3 KEEP", the days' bounds in µs of Unix time and
// KEEP in ms.
func (a *licenseAdd) arg() string {
	return fmt.Sprintf("%d %d %d %d %d %d %d %d", a.Seq, a.Acked, min(a.D, maxDaySpend),
		a.Days[0].start.UnixMicro(), a.Days[1].start.UnixMicro(), a.Days[2].start.UnixMicro(), a.Days[2].end.UnixMicro(),
		a.Keep.Milliseconds())
}

// keys is the three days' keys.
func (a *licenseAdd) keys(name string) []string {
	return []string{dayKey(name, a.Days[0]), dayKey(name, a.Days[1]), dayKey(name, a.Days[2])}
}

// licenseView is what a report with an add answers: the store's TIME,
// the day it added to (0, 1 or 2 of licenseAdd.Days; -1 when the store's
// clock is in none of them, and nothing was added) and that day's total
// after the add, bytes.
type licenseView struct {
	now   time.Time
	day   int
	total uint64
}

// licenseState is the controller's side of the add, the loop's alone.
type licenseState struct {
	seq, acked uint64
	// skew is the store's clock less this host's at the last answer (the
	// answer's TIME against its arrival): the next add's days are the
	// ones around now + skew. known is false before any answer: the
	// host's clock then.
	skew  time.Duration
	known bool
	// unreachable says Unreachable was called and no answer since;
	// badDays that a bad day function was logged.
	unreachable, badDays bool
}

// takeSpend takes the ledger's spend since its last acknowledged add into
// a new add, for the report being sent; nil without a license.
func (c *Controller) takeSpend(cfg *Config) *licenseAdd {
	l := cfg.License
	if l == nil || l.Ledger == nil || l.Day == nil {
		return nil
	}
	s := &c.lic
	t := hostNow()
	if s.known {
		t = t.Add(s.skew)
	}
	days := l.days(t)
	if !days[0].start.Before(days[1].start) || !days[1].start.Before(days[2].start) || !days[2].start.Before(days[2].end) ||
		days[1].start.After(t) || !t.Before(days[1].end) {
		// A day function that does not tile time would have the script
		// refuse the report, and the fleet's sharing with it: no add.
		if !s.badDays {
			c.log.Error("fleet license: the license's days around this time do not follow each other: no spend added", "at", t,
				"days", fmt.Sprint(days))
			s.badDays = true
		}
		return nil
	}
	s.badDays = false
	d, ack := l.Ledger.TakeSpend()
	s.seq++
	return &licenseAdd{Seq: s.seq, Acked: s.acked, D: d, Days: days, Keep: dayKeep(days[1]), ack: ack}
}

// spent takes an answered report's add: the ack point moves to it, and
// the ledger learns the fleet's day total and the member count. A report
// whose store's clock was in none of its days added nothing (the worker
// acked false): the next report's days are around the store's clock.
func (c *Controller) spent(cfg *Config, a *licenseAdd, v view, at time.Time) {
	if a == nil || v.lic == nil {
		return
	}
	s := &c.lic
	s.skew, s.known = v.lic.now.Sub(at), true
	s.unreachable = false
	if v.lic.day < 0 {
		c.log.Debug("fleet license: the store's clock is in none of the report's days: added at the next report",
			"store_time", v.lic.now)
		return
	}
	s.acked = a.Seq
	if l := cfg.License; l != nil && l.Ledger != nil {
		l.Ledger.FleetSpent(a.Days[v.lic.day].named, v.lic.total, v.members)
	}
}

// licenseUnreachable tells the ledger, once per spell out of reach, that
// the store is out of reach (the member entered fallback).
func (c *Controller) licenseUnreachable() {
	l := c.cfg.Load().License
	if l == nil || l.Ledger == nil || c.lic.unreachable {
		return
	}
	c.lic.unreachable = true
	l.Ledger.Unreachable()
}

// parseLicense reads the three values a report with an add returns after
// the fleet's six: the store's TIME (µs), the day (0..2, -1) and its total.
func parseLicense(res []any) (*licenseView, error) {
	var n [3]int64
	for i, r := range res {
		switch v := r.(type) {
		case int64:
			n[i] = v
		case string:
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("fleet report script: license value %d: %q is not a whole number", i+1, v)
			}
			n[i] = x
		default:
			return nil, fmt.Errorf("fleet report script: license value %d is a %T", i+1, r)
		}
	}
	if n[1] < -1 || n[1] > 2 || n[2] < 0 {
		return nil, fmt.Errorf("fleet report script: license day %d, total %d out of range", n[1], n[2])
	}
	return &licenseView{now: time.UnixMicro(n[0]), day: int(n[1]), total: uint64(n[2])}, nil
}

// licenseLua is the report script's license part (docs/design.md §12,
// "One license for the fleet"). licenseArgs reads ARGV[10], "SEQ ACKED D
// B0 B1 B2 B3 KEEP" (nil without one; a string, the error, when it cannot).
// spend adds the instance's bytes to the day the store's clock now (µs) is
// in, [B_i, B_i+1), KEYS[4 + i]: each day is a hash
//
//	total            the fleet's bytes that day
//	NAME#INSTANCE    "SEQ X SPENT": the instance's last add (its
//	                 sequence number), the bytes that adds after its
//	                 ack point brought (X) and its own bytes that day
//
// It adds D less X when the record (the one in the day added to, else
// the one with the greatest SEQ among the other two) is of a report
// after ACKED: that report's answer was
// lost, its bytes are in D again. A report older than the record is one
// that a later report overtook (a connection abandoned with its command
// sent): it adds nothing. A total that is not a number is rebuilt from
// the instances' SPENT. It returns the day (0..2, -1 when now is in none
// and nothing was added) and its total. The key lives until the day's end
// + KEEP ms.
var licenseLua = fmt.Sprintf(`
local LCAP = %d
local function licenseArgs()
  local a = ARGV[10]
  if not a or a == '' then return nil end
  local f = {string.match(a, '^(%%d+) (%%d+) (%%d+) (%%d+) (%%d+) (%%d+) (%%d+) (%%d+)$')}
  if #f ~= 8 then return 'bad license add' end
  for i = 1, 8 do
    if #f[i] > 16 then return 'bad license add' end
    f[i] = tonumber(f[i])
  end
  if f[3] > LCAP or not (f[4] < f[5] and f[5] < f[6] and f[6] < f[7]) then return 'bad license add' end
  return {seq = f[1], acked = f[2], d = f[3], b = {f[4], f[5], f[6], f[7]}, keep = f[8]}
end
local function spend(l, now, field)
  local i = -1
  for j = 1, 3 do
    if l.b[j] <= now and now < l.b[j + 1] then i = j end
  end
  if i < 0 then return -1, 0 end
  local key = KEYS[3 + i]
  -- The instance's record: in the day added to when it added to it
  -- before (the store's clock never goes back a day, so no other day
  -- holds a later one), else the greatest among the other two.
  local S, X, mine, found = -1, 0, 0, false
  local function rec(j)
    local v = redis.call('HGET', KEYS[3 + j], field)
    local rs, rx, rm
    if v then rs, rx, rm = string.match(v, '^(%%d+) (%%d+) (%%d+)$') end
    if rs and #rs <= 16 and #rx <= 16 and #rm <= 16 then
      if tonumber(rs) > S then S, X = tonumber(rs), tonumber(rx) end
      if j == i then mine, found = tonumber(rm), true end
    end
  end
  rec(i)
  if not found then
    for j = 1, 3 do
      if j ~= i then rec(j) end
    end
  end
  local tv = redis.call('HGET', key, 'total')
  local total = tv and string.find(tv, '^%%d+$') and #tv <= 16 and tonumber(tv)
  if not total then
    total = 0
    local all = redis.call('HGETALL', key)
    for j = 1, #all, 2 do
      local rm = string.match(all[j + 1], '^%%d+ %%d+ (%%d+)$')
      if all[j] ~= 'total' and rm and #rm <= 16 then total = total + tonumber(rm) end
    end
  end
  if l.seq <= S then return i - 1, total end
  local add, x = l.d, l.d
  if S > l.acked then
    add = math.max(l.d - X, 0)
    x = math.max(l.d, X)
  end
  total = math.min(total + add, LCAP)
  redis.call('HSET', key, field, string.format('%%d %%d %%d', l.seq, x, math.min(mine + add, LCAP)),
    'total', string.format('%%d', total))
  if not found then
    -- The instance's first add to the day: the key's expiry (the same
    -- for every member), set again.
    redis.call('PEXPIRE', key, string.format('%%d', math.max(math.floor((l.b[i + 1] - now) / 1000) + l.keep, 1000)))
  end
  return i - 1, total
end
`, maxDaySpend)
