package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// One fleet's state is four keys in one hash slot, so that one script
// reaches them on one node of a Redis Cluster (docs/design.md §12, Store):
//
//	{tierlimit:fleet:NAME}:est3    hash   NAME#INSTANCE -> "IN TOTAL HEARD TTL WINDOW MAX DIGEST"
//	{tierlimit:fleet:NAME}:exp3    zset   NAME#INSTANCE -> when the entry ages out: HEARD + TTL (µs)
//	{tierlimit:fleet:NAME}:sum3    string "IN TOTAL AT GROUPS SETTINGS": the sums of :est3, when they
//	                                      were last rebuilt (µs), and the census of the settings then
//	{tierlimit:fleet:NAME}:names3  hash   NAME -> the instances that hold an entry under NAME
//
// An entry is one instance of a member (one start of an agent): its
// estimates R̂_in and R̂_tot (packets per window), when the store heard it
// (HEARD, the server's µs) and the ttl it wrote (µs, so that it ages out on
// its own ttl, never the reporter's), and its settings: the window (ns),
// fleet.max and the digest of its table (tiers.Policy.FleetDigest).
//
// Every value is read as untrusted (a member's ACL user may write any of
// these keys, docs/design.md §12, Trust): the script refuses estimates
// that are not whole numbers up to maxEstimate; an entry it cannot read,
// or one whose HEARD and TTL are out of range, is dropped; the sums are
// rebuilt from the entries at the first report after they are one report
// old (about ten times a second for the fleet at report 100 ms, whatever
// its size) and at once when they cannot be read, have lost their expiry
// (a plain SET), disagree with the entries (a count, a value that cannot
// be subtracted, a sum below the reporter's own estimate) or are missing.
// Between rebuilds they are kept by the reports, O(log members) each.
//
// The names end in 3: version 3 carries the instance and the settings;
// the pairs of :est2 (no instance) are not read, so a fleet upgrades as
// one (docs/operations.md, Fleet).
func keys(name string) []string {
	tag := "{tierlimit:fleet:" + name + "}"
	return []string{tag + ":est3", tag + ":exp3", tag + ":sum3", tag + ":names3"}
}

// maxEstimate bounds what a member reports: Lua numbers are doubles, and a
// sum of estimates must stay exact. No window holds 2^44 packets.
const maxEstimate = 1 << 44

// maxEntryTTL is the longest ttl an entry may carry (tiers.MaxFleetTTL);
// an entry with a longer one, or heard later than now + maxEntryTTL, is
// dropped as written by something else than the script.
const maxEntryTTL = time.Hour

// commonLua is the helpers of the scripts: entry reads a value of :est3
// into its estimates, HEARD, TTL and settings (nil when it cannot);
// unname removes an instance's field from :names3.
var commonLua = fmt.Sprintf(`
local CAP, MAXTTL = %d, %d
local function entry(v)
  if type(v) ~= 'string' then return nil end
  local a, b, h, l, w, m, d = string.match(v, '^(%%d+) (%%d+) (%%d+) (%%d+) (%%d+) (%%d+) (%%x+)$')
  if not a or #a > 15 or #b > 15 or #h > 17 or #l > 12 or #w > 15 or #m > 15 or #d > 64 then return nil end
  local ai, bi, hi, li = tonumber(a), tonumber(b), tonumber(h), tonumber(l)
  if ai > CAP or bi > CAP or ai > bi or li <= 0 or li > MAXTTL then return nil end
  return ai, bi, hi, li, w .. ':' .. m .. ':' .. l .. ':' .. d
end
local function unname(f)
  local nm, it = string.match(f, '^(.*)#(%%x+)$')
  if not nm then return end
  local list = redis.call('HGET', KEYS[4], nm)
  if not list then return end
  local keep = {}
  for tok in string.gmatch(list, '%%S+') do
    if tok ~= it and #keep < 64 then keep[#keep + 1] = tok end
  end
  if #keep == 0 then redis.call('HDEL', KEYS[4], nm) else redis.call('HSET', KEYS[4], nm, table.concat(keep, ' ')) end
end
`, maxEstimate, maxEntryTTL.Microseconds())

// reportScript writes one instance's entry and returns {the others'
// in-budget sum, their total, the entries (instances) in the fleet, the
// other live instances under this member's name, the settings groups
// among the entries, 1 when this entry's settings are not the most
// members'}. ARGV: 1 field NAME#INSTANCE, 2 name, 3 instance, 4 R̂_in,
// 5 R̂_tot, 6 ttl µs, 7 window ns, 8 fleet.max, 9 digest, 10 report µs (how
// old the sums may grow before a rebuild), 11 the keys' expiry ms (so that
// a fleet with no member left vanishes), 12 the field of an earlier
// instance this one replaces ("" for none): it is dropped at once.
// Integers go out through string.format('%d'): Lua numbers are doubles,
// exact below 2^53.
var reportScript = redis.NewScript(commonLua + `
local function whole(s, most)
  return type(s) == 'string' and #s <= 17 and string.match(s, '^%d+$') ~= nil and tonumber(s) <= most
end
if not whole(ARGV[4], CAP) or not whole(ARGV[5], CAP) or tonumber(ARGV[4]) > tonumber(ARGV[5]) then
  return redis.error_reply('ERR tierlimit: estimates must be whole numbers with in <= total <= ' .. CAP)
end
if not whole(ARGV[6], MAXTTL) or tonumber(ARGV[6]) == 0 or not whole(ARGV[7], 1e15) or not whole(ARGV[8], CAP)
  or not whole(ARGV[10], MAXTTL) or not string.match(ARGV[9], '^%x+$') or #ARGV[9] > 64 then
  return redis.error_reply('ERR tierlimit: bad ttl, window, max, digest or report')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local field, name, inst = ARGV[1], ARGV[2], ARGV[3]
local ein, etot, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local mine = ARGV[7] .. ':' .. ARGV[8] .. ':' .. ARGV[6] .. ':' .. ARGV[9]

local sin, stot, at, groups, best
local s = redis.call('GET', KEYS[3])
if s and redis.call('PTTL', KEYS[3]) > 0 then
  local a, b, c, g, f = string.match(s, '^(%d+) (%d+) (%d+) (%d+) (%S+)$')
  if a then sin, stot, at, groups, best = tonumber(a), tonumber(b), tonumber(c), tonumber(g), f end
end
local dirty = not sin or at > now or now - at >= tonumber(ARGV[10]) or
  redis.call('HLEN', KEYS[1]) ~= redis.call('ZCARD', KEYS[2])

local din, dtot = 0, 0
local function drop(f)
  local v = redis.call('HGET', KEYS[1], f)
  redis.call('ZREM', KEYS[2], f)
  if not v then return end
  local a, b = entry(v)
  if a then din, dtot = din - a, dtot - b else dirty = true end
  redis.call('HDEL', KEYS[1], f)
  unname(f)
end
if ARGV[12] ~= '' and ARGV[12] ~= field then drop(ARGV[12]) end
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now))
for i = 1, #stale do
  if stale[i] ~= field then drop(stale[i]) end
end
local old = redis.call('HGET', KEYS[1], field)
if old then
  local a, b = entry(old)
  if a then din, dtot = din - a, dtot - b else dirty = true end
end
redis.call('HSET', KEYS[1], field, string.format('%d %d %d %d %s %s %s', ein, etot, now, ttl, ARGV[7], ARGV[8], ARGV[9]))
redis.call('ZADD', KEYS[2], string.format('%d', now + ttl), field)
din, dtot = din + ein, dtot + etot

if not dirty then
  sin, stot = sin + din, stot + dtot
  dirty = sin < ein or stot < etot or sin > stot
end
if dirty then
  -- Rebuild: the sums and the census of the settings from the entries,
  -- dropping each that cannot be read or has aged out on its own ttl.
  sin, stot = 0, 0
  local census, exp, n = {}, {}, 0
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local a, b, h, l, fp = entry(all[i + 1])
    if a and h + l > now and h <= now + MAXTTL then
      sin, stot, n = sin + a, stot + b, n + 1
      census[fp] = (census[fp] or 0) + 1
      exp[all[i]] = h + l
    else
      redis.call('HDEL', KEYS[1], all[i])
      redis.call('ZREM', KEYS[2], all[i])
      unname(all[i])
    end
  end
  if redis.call('ZCARD', KEYS[2]) ~= n then
    redis.call('DEL', KEYS[2])
    for f, e in pairs(exp) do redis.call('ZADD', KEYS[2], string.format('%d', e), f) end
  end
  groups, best = 0, '-'
  local most = 0
  for fp, c in pairs(census) do
    groups = groups + 1
    if c > most or (c == most and fp < best) then best, most = fp, c end
  end
  at = now
  redis.call('SET', KEYS[3], string.format('%d %d %d %d %s', sin, stot, at, groups, best), 'PX', ARGV[11])
  redis.call('PEXPIRE', KEYS[1], ARGV[11])
  redis.call('PEXPIRE', KEYS[2], ARGV[11])
  redis.call('PEXPIRE', KEYS[4], ARGV[11])
else
  redis.call('SET', KEYS[3], string.format('%d %d %d %d %s', sin, stot, at, groups, best), 'KEEPTTL')
end

-- The instances under this member's name: each one listed that still
-- holds an entry, this one added.
local list = redis.call('HGET', KEYS[4], name)
local toks, me, changed = {}, false, false
if list and #list <= 4096 then
  for tok in string.gmatch(list, '%S+') do
    if tok == inst then
      if not me then toks[#toks + 1] = tok end
      me = true
    elseif #toks < 64 and redis.call('HEXISTS', KEYS[1], name .. '#' .. tok) == 1 then
      toks[#toks + 1] = tok
    else
      changed = true
    end
  end
elseif list then
  changed = true
end
if not me then toks[#toks + 1] = inst; changed = true end
if changed then redis.call('HSET', KEYS[4], name, table.concat(toks, ' ')) end

local differs = 0
if mine ~= best then
  differs = 1
  if groups < 2 then groups = 2 end
end
return {string.format('%d', sin - ein), string.format('%d', stot - etot), redis.call('ZCARD', KEYS[2]), #toks - 1, groups, differs}
`)

// leaveScript removes the entry ARGV[1] (NAME#INSTANCE) and drops the sums,
// which the next report rebuilds from the entries.
var leaveScript = redis.NewScript(commonLua + `
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
unname(ARGV[1])
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
	// Est is the member's R̂_in and R̂_tot, packets per window.
	Est Sums
	// TTL is the entry's own ttl; Report the member's report interval:
	// the sums are rebuilt once they are that old.
	TTL, Report time.Duration
	// Window, Max and Digest are the settings the members compare: the
	// policy's window, fleet.max and tiers.Policy.FleetDigest.
	Window time.Duration
	Max    uint64
	Digest string
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

// report runs reportScript for e: one round trip (EVALSHA, or EVAL
// when the server does not hold the script yet).
func report(ctx context.Context, c redis.UniversalClient, name string, e entry) (view, error) {
	est := e.Est
	est.Total = min(est.Total, maxEstimate)
	est.In = min(est.In, est.Total)
	expireMS := max(2*e.TTL.Milliseconds(), 1000)
	digest := e.Digest
	if digest == "" {
		digest = "0"
	}
	res, err := reportScript.Run(ctx, c, keys(name), e.field(), e.Member, e.Instance,
		strconv.FormatUint(est.In, 10), strconv.FormatUint(est.Total, 10), e.TTL.Microseconds(),
		e.Window.Nanoseconds(), e.Max, digest, max(e.Report.Microseconds(), 1), expireMS,
		fieldOf(e.Member, e.Replaces)).Slice()
	if err != nil {
		return view{}, err
	}
	return parseView(res)
}

// parseView reads reportScript's reply.
func parseView(res []any) (view, error) {
	if len(res) != 6 {
		return view{}, fmt.Errorf("fleet report script returned %d values, want 6", len(res))
	}
	var n [6]int64
	for i, r := range res {
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
