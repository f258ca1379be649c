package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// One fleet's state is three keys in one hash slot, so that one script
// reaches them on one node of a Redis Cluster (docs/design.md §12, Store):
//
//	{tierlimit:fleet:NAME}:est3  hash   NAME#INSTANCE -> "IN TOTAL HEARD TTL WINDOW MAX DIGEST"
//	{tierlimit:fleet:NAME}:exp3  zset   NAME#INSTANCE -> when the entry ages out: HEARD + TTL (µs)
//	{tierlimit:fleet:NAME}:sum3  string "IN TOTAL AT GROUPS SHARED ENTRIES|TTL WINDOW MAX DIGEST"
//	                                    and a line "\nNAME\tN" for each of the SHARED names that
//	                                    N > 1 instances share
//
// An entry is one instance of a member (one start of an agent): its
// estimates R̂_in and R̂_tot (packets per window), when the store heard it
// (HEARD, the server's µs) and the ttl it wrote (µs, so that it ages out on
// its own ttl, never the reporter's), and its settings: the window (ns),
// fleet.max and the digest of its table (tiers.Policy.FleetDigest). :sum3
// holds the sums of the entries, when they were last rebuilt (AT, µs),
// what that rebuild found (the number of distinct settings, those of the
// most entries, and the names under which more than one instance
// reports) and the entry count, kept as the sums are.
//
// Every value is read as untrusted (a member's ACL user may write any of
// these keys, docs/design.md §12, Trust): the script refuses estimates
// that are not whole numbers up to maxEstimate; an entry it cannot read,
// or one whose HEARD and TTL are out of range, is dropped; the sums are
// rebuilt from the entries at the first report after they are
// rebuildEvery or one report old, whichever is longer (once a second for
// the fleet at report 100 ms, whatever its size), and at once when they cannot be read, have lost their expiry
// (a plain SET), disagree with the entries (a value that cannot be
// subtracted, a sum below the reporter's own estimate, the reporter's
// own entry not what it last wrote) or are missing.
// Between rebuilds the reports keep them, O(log members) each; a join is
// counted at once, and in the census and the names at the next rebuild
// (a rebuild per join would cost O(members²) when a whole fleet joins a
// store that restarted).
//
// The names end in 3: version 3 carries the instance and the settings;
// the pairs of :est2 (no instance) are not read, so a fleet upgrades as
// one (docs/operations.md, Fleet).
func keys(name string) []string {
	tag := "{tierlimit:fleet:" + name + "}"
	return []string{tag + ":est3", tag + ":exp3", tag + ":sum3"}
}

// maxEstimate bounds what a member reports: Lua numbers are doubles, and a
// sum of estimates must stay exact. No window holds 2^44 packets.
const maxEstimate = 1 << 44

// maxEntryTTL is the longest ttl an entry may carry (tiers.MaxFleetTTL);
// an entry with a longer one, or heard later than now + maxEntryTTL, is
// dropped as written by something else than the script.
const maxEntryTTL = time.Hour

// commonLua is the helpers of the scripts: entry reads a value of :est3
// into its estimates, HEARD, its settings "TTL WINDOW MAX DIGEST" and TTL
// (nil when it cannot); sub reads only the estimates of a value of the
// same form, for a report that subtracts it.
var commonLua = fmt.Sprintf(`
local CAP, MAXTTL = %d, %d
local function entry(v)
  local a, b, h, tail, l = string.match(v, '^(%%d+) (%%d+) (%%d+) ((%%d+) %%d+ %%d+ %%x+)$')
  if not a or #a > 15 or #b > 15 or #h > 17 or #l > 10 then return nil end
  local ai, bi, li = tonumber(a), tonumber(b), tonumber(l)
  if ai > CAP or bi > CAP or ai > bi or li <= 0 or li > MAXTTL then return nil end
  return ai, bi, tonumber(h), tail, li
end
local function sub(v)
  local a, b = string.match(v, '^(%%d+) (%%d+) %%d+ %%d+ %%d+ %%d+ %%x+$')
  if not a or #a > 15 or #b > 15 then return nil end
  a, b = tonumber(a), tonumber(b)
  if a > CAP or b > CAP or a > b then return nil end
  return a, b
end
`, maxEstimate, maxEntryTTL.Microseconds())

// reportScript writes one instance's entry and returns {the others'
// in-budget sum, their total, the entries (instances) in the fleet, the
// other live instances under this member's name, the settings groups
// among the entries, 1 when this entry's settings are not the most
// members'}. ARGV: 1 field NAME#INSTANCE, 2 name, 3 R̂_in, 4 R̂_tot, 5 the
// settings "TTL WINDOW MAX DIGEST" (ttl µs, window ns, fleet.max, the
// table's digest in hex), 6 report µs (how old the sums may grow before
// a rebuild), 7 the keys' least expiry ms, set at each rebuild (so that
// a fleet with no member left vanishes; never before its last entry), 8 the field of an earlier instance this one replaces (""
// for none): it is dropped at once, 9 "IN TOTAL" as this instance last
// wrote them, answered ("" before its first answer): an entry that holds
// other estimates, or none, was written by someone else, and the sums
// are rebuilt, 10 the license's add ("" for none: licenseLua; KEYS 4 to
// 6 are then its three days), which makes the reply 9 values: the
// store's TIME (µs), the day added to and its total (licenseView).
// Numbers leave as Lua numbers
// (doubles, exact below 2^53; the reply truncates them to integers) or
// through string.format('%d').
var reportScript = redis.NewScript(commonLua + licenseLua + `
local lic = licenseArgs()
if type(lic) == 'string' then return redis.error_reply('ERR tierlimit: ' .. lic) end
local ein, etot = ARGV[3], ARGV[4]
if #ein > 15 or #etot > 15 or not string.find(ein, '^%d+$') or not string.find(etot, '^%d+$') then
  return redis.error_reply('ERR tierlimit: estimates must be whole numbers with in <= total <= ' .. CAP)
end
ein, etot = tonumber(ein), tonumber(etot)
if ein > CAP or etot > CAP or ein > etot then
  return redis.error_reply('ERR tierlimit: estimates must be whole numbers with in <= total <= ' .. CAP)
end
local mine = ARGV[5]
local ttl = string.match(mine, '^(%d+) %d+ %d+ %x+$')
if not ttl or #ttl > 10 or #mine > 100 or tonumber(ttl) <= 0 or tonumber(ttl) > MAXTTL or not string.find(ARGV[6], '^%d+$') then
  return redis.error_reply('ERR tierlimit: bad settings (ttl in (0, 1h], window, max, digest) or report')
end
ttl = tonumber(ttl)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowS = t[1] .. string.sub('00000' .. t[2], -6)
local field, name = ARGV[1], ARGV[2]

local sin, stot, atS, groups, nconf, count, tail
local s = redis.call('GET', KEYS[3])
if s and redis.call('PTTL', KEYS[3]) > 0 then
  local _, j, a, b, c, g, nc, n = string.find(s, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)|')
  if a then sin, stot, atS, groups, nconf, count, tail = tonumber(a), tonumber(b), c, g, nc, tonumber(n), string.sub(s, j) end
end
local dirty = not sin or tonumber(atS) > now or now - tonumber(atS) >= tonumber(ARGV[6])

local din, dtot = 0, 0
local function drop(f)
  local v = redis.call('HGET', KEYS[1], f)
  redis.call('ZREM', KEYS[2], f)
  if not v then return end
  local a, b = sub(v)
  if a then din, dtot = din - a, dtot - b else dirty = true end
  redis.call('HDEL', KEYS[1], f)
  if count then count = count - 1 end
end
if ARGV[8] ~= '' and ARGV[8] ~= field then drop(ARGV[8]) end
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', nowS)
for i = 1, #stale do
  if stale[i] ~= field then drop(stale[i]) end
end
local old = redis.call('HGET', KEYS[1], field)
if old then
  local a, b = sub(old)
  if a then din, dtot = din - a, dtot - b else dirty = true end
  -- Not what this instance wrote last: someone else wrote it, and the
  -- sums do not hold it.
  if ARGV[9] ~= '' and string.find(old, ARGV[9] .. ' ', 1, true) ~= 1 then dirty = true end
else
  if count then count = count + 1 end
  if ARGV[9] ~= '' then dirty = true end -- this instance's entry went away (deleted, or pruned while the store was slow)
end
redis.call('HSET', KEYS[1], field, ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. nowS .. ' ' .. mine)
redis.call('ZADD', KEYS[2], string.format('%d', now + ttl), field)
din, dtot = din + ein, dtot + etot

if not dirty then
  sin, stot = sin + din, stot + dtot
  dirty = sin < ein or stot < etot or sin > stot or count < 1
end
if dirty then
  -- Rebuild: the sums, the census of the settings and the names from the
  -- entries, dropping each that cannot be read or has aged out on its
  -- own ttl.
  sin, stot = 0, 0
  local census, names, exp, n, last = {}, {}, {}, 0, now
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local a, b, h, fp, l = entry(all[i + 1])
    local sep = string.find(all[i], '#%x+$')
    if a and sep and h + l > now and h <= now + MAXTTL then
      sin, stot, n = sin + a, stot + b, n + 1
      census[fp] = (census[fp] or 0) + 1
      local nm = string.sub(all[i], 1, sep - 1)
      names[nm] = (names[nm] or 0) + 1
      exp[all[i]] = h + l
      if h + l > last then last = h + l end
    else
      redis.call('HDEL', KEYS[1], all[i])
      redis.call('ZREM', KEYS[2], all[i])
    end
  end
  if redis.call('ZCARD', KEYS[2]) ~= n then
    redis.call('DEL', KEYS[2])
    for f, e in pairs(exp) do redis.call('ZADD', KEYS[2], string.format('%d', e), f) end
  end
  local best, most, g = '-', 0, 0
  for fp, c in pairs(census) do
    g = g + 1
    if c > most or (c == most and fp < best) then best, most = fp, c end
  end
  local shared, nc = {'|' .. best}, 0
  for nm, c in pairs(names) do
    if c > 1 then shared[#shared + 1] = nm .. '\t' .. c; nc = nc + 1 end
  end
  atS, groups, nconf, count, tail = nowS, tostring(g), tostring(nc), n, table.concat(shared, '\n')
  -- The keys outlive the last entry and the next rebuild.
  local px = string.format('%d', math.max(tonumber(ARGV[7]), math.floor((last - now) / 1000) + 1000))
  redis.call('SET', KEYS[3], string.format('%d %d ', sin, stot) .. atS .. ' ' .. groups .. ' ' .. nconf .. ' ' .. count .. tail, 'PX', px)
  redis.call('PEXPIRE', KEYS[1], px)
  redis.call('PEXPIRE', KEYS[2], px)
else
  redis.call('SET', KEYS[3], string.format('%d %d ', sin, stot) .. atS .. ' ' .. groups .. ' ' .. nconf .. ' ' .. count .. tail, 'KEEPTTL')
end

-- Other instances under this name, as the last rebuild found them, and
-- whether this entry's settings are those of the most entries: tail is
-- "|BEST" and a line "\nNAME\tN" per shared name.
local others = 0
if nconf ~= '0' then
  local _, e = string.find(tail, '\n' .. name .. '\t', 1, true)
  if e then others = tonumber(string.match(tail, '^%d+', e + 1) or '1') - 1 end
end
groups = tonumber(groups)
local differs = 0
local k = #mine + 1
if string.find(tail, mine, 2, true) ~= 2 or (#tail > k and string.byte(tail, k + 1) ~= 10) then
  differs = 1
  if groups < 2 then groups = 2 end
end
if lic then
  local d, total = spend(lic, now, field)
  return {sin - ein, stot - etot, count, others, groups, differs, nowS, d, string.format('%d', total)}
end
return {sin - ein, stot - etot, count, others, groups, differs}
`)

// leaveScript removes the entry ARGV[1] (NAME#INSTANCE) and drops the sums,
// which the next report rebuilds from the entries.
var leaveScript = redis.NewScript(`
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
return 1
`)

// statusScript returns {server time µs, HGETALL :est3} in one round trip;
// it writes nothing.
var statusScript = redis.NewScript(`
local t = redis.call('TIME')
return {string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2])), redis.call('HGETALL', KEYS[1])}
`)

// entry is what one report writes: one instance's estimates and settings.
type entry struct {
	// Member is the member's name, Instance this start's id (newInstance),
	// Replaces the id of the earlier instance of this member on this host
	// ("" for none), whose entry the report drops at once.
	Member, Instance, Replaces string
	// Est is the member's R̂_in and R̂_tot, packets per window; Prev
	// those this instance last wrote in an answered report (nil before
	// the first), which the script checks its entry against.
	Est  Sums
	Prev *Sums
	// TTL is the entry's own ttl; Report the member's report interval:
	// the sums are rebuilt once they are that old.
	TTL, Report time.Duration
	// Window, Max and Digest are the settings the members compare: the
	// policy's window, fleet.max and tiers.Policy.FleetDigest.
	Window time.Duration
	Max    uint64
	Digest string
	// Lic is the license's add (license.go), nil without a license.
	Lic *licenseAdd
}

// settings is the entry's settings as the script compares them: "TTL
// WINDOW MAX DIGEST", the ttl in µs and the window in ns (Member.settings).
func (e entry) settings(digest string) string {
	return fmt.Sprintf("%d %d %d %s", e.TTL.Microseconds(), e.Window.Nanoseconds(), e.Max, digest)
}

// field is the entry's field in :est3.
func (e entry) field() string { return e.Member + "#" + e.Instance }

// fieldOf returns the field of member's instance inst, "" when inst is "".
func fieldOf(member, inst string) string {
	if inst == "" {
		return ""
	}
	return member + "#" + inst
}

// rebuildEvery is how often, at the least, the sums are rebuilt from the
// entries while members report (or each report interval, when longer):
// the bound on how long a well-formed forgery of the sums lasts
// (docs/design.md §12, Trust). A rebuild reads every entry; once a second
// it costs the store about 1 % of a report's work per report at 1,000
// members (TestFleetPerfScript).
const rebuildEvery = time.Second

// clampSums holds s within what the script takes: Total up to
// maxEstimate, In up to Total.
func clampSums(s Sums) Sums {
	s.Total = min(s.Total, maxEstimate)
	s.In = min(s.In, s.Total)
	return s
}

// report runs reportScript for e: one round trip (EVALSHA, or EVAL
// when the server does not hold the script yet).
func report(ctx context.Context, c redis.UniversalClient, name string, e entry) (view, error) {
	est := clampSums(e.Est)
	// The keys' expiry, set at each rebuild: past the next rebuild and
	// every entry's ttl, so that only a fleet with no member left vanishes.
	expireMS := max(2*e.TTL, 3*max(e.Report, rebuildEvery)).Milliseconds()
	digest := e.Digest
	if digest == "" {
		digest = "0"
	}
	prev := ""
	if e.Prev != nil {
		p := clampSums(*e.Prev)
		prev = strconv.FormatUint(p.In, 10) + " " + strconv.FormatUint(p.Total, 10)
	}
	ks, lic := keys(name), ""
	if e.Lic != nil {
		ks, lic = append(ks, e.Lic.keys(name)...), e.Lic.arg()
	}
	res, err := reportScript.Run(ctx, c, ks, e.field(), e.Member,
		strconv.FormatUint(est.In, 10), strconv.FormatUint(est.Total, 10), e.settings(digest),
		max(e.Report, rebuildEvery).Microseconds(), expireMS, fieldOf(e.Member, e.Replaces), prev, lic).Slice()
	if err != nil {
		return view{}, err
	}
	return parseView(res, e.Lic != nil)
}

// parseView reads reportScript's reply: 6 values, 9 with a license's add.
func parseView(res []any, lic bool) (view, error) {
	want := 6
	if lic {
		want = 9
	}
	if len(res) != want {
		return view{}, fmt.Errorf("fleet report script returned %d values, want %d", len(res), want)
	}
	var n [6]int64
	for i, r := range res[:6] {
		switch v := r.(type) {
		case int64:
			n[i] = v
		case string:
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return view{}, fmt.Errorf("fleet report script: value %d: %q is not a whole number", i+1, v)
			}
			n[i] = x
		default:
			return view{}, fmt.Errorf("fleet report script: value %d is a %T", i+1, r)
		}
	}
	v := view{members: int(n[2]), conflicts: int(max(n[3], 0)), groups: int(max(n[4], 0)), differs: n[5] != 0}
	v.others.Total = uint64(max(n[1], 0))
	v.others.In = min(uint64(max(n[0], 0)), v.others.Total)
	if lic {
		l, err := parseLicense(res[6:])
		if err != nil {
			return view{}, err
		}
		v.lic = l
	}
	return v, nil
}

// parseEntry reads a value of :est3 into m; false when it cannot.
func parseEntry(field, v string, m *Member) bool {
	i := strings.LastIndexByte(field, '#')
	f := strings.Fields(v)
	if i < 0 || len(f) != 7 {
		return false
	}
	var n [6]uint64
	for k := range 6 {
		x, err := strconv.ParseUint(f[k], 10, 64)
		if err != nil {
			return false
		}
		n[k] = x
	}
	*m = Member{Name: field[:i], Instance: field[i+1:], In: min(n[0], n[1]), Estimate: n[1],
		Heard: time.UnixMicro(int64(n[2])), TTL: time.Duration(n[3]) * time.Microsecond,
		Window: time.Duration(n[4]), Max: n[5], Digest: f[6]}
	return true
}

// members reads the fleet's entries with statusScript, in no order, each
// with its age on the store's clock; entries that cannot be read are left
// out. Conflict and Differs are set as judgeMembers sets them.
func members(ctx context.Context, c redis.UniversalClient, name string) ([]Member, error) {
	res, err := statusScript.Run(ctx, c, keys(name)).Slice()
	if err != nil {
		return nil, fmt.Errorf("fleet %s status: %w", name, refusal(err))
	}
	if len(res) != 2 {
		return nil, fmt.Errorf("fleet %s status: the script returned %d values, want 2", name, len(res))
	}
	nowS, _ := res[0].(string)
	now, err := strconv.ParseInt(nowS, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("fleet %s status: server time %q: %v", name, nowS, err)
	}
	est, _ := res[1].([]any)
	out := make([]Member, 0, len(est)/2)
	for i := 0; i+1 < len(est); i += 2 {
		f, _ := est[i].(string)
		v, _ := est[i+1].(string)
		var m Member
		if !parseEntry(f, v, &m) {
			continue
		}
		m.Age = time.Duration(now-m.Heard.UnixMicro()) * time.Microsecond
		out = append(out, m)
	}
	judgeMembers(out)
	return out, nil
}
