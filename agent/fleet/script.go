package fleet

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// One fleet's state is three keys in one hash slot, so that one script
// reaches them on one node of a Redis Cluster:
//
//	{tierlimit:fleet:NAME}:est2   hash   member -> "IN TOTAL": its last reported R̂_in and R̂_tot (packets per window)
//	{tierlimit:fleet:NAME}:seen2  zset   member -> server time of its last report (µs)
//	{tierlimit:fleet:NAME}:sum2   string "IN TOTAL": the sums of :est2, kept by the scripts
//
// The sums make a report O(log members) instead of O(members): a store of
// 1,000 members at 10 reports per second each must not walk the hash
// 10,000 times a second. A script that finds the keys out of step (one
// expired alone, a flush) rebuilds the sums from :est2 or starts over.
//
// The names end in 2 since members report two estimates (docs/design.md
// §12, "With budgets and severity"): the single estimate of earlier
// versions lived under :est, :seen and :sum, whose scripts cannot read a
// pair (no release carried them: the fleet came with both estimates). A
// single-value entry in :est2 reads as IN = TOTAL.
func keys(name string) []string {
	tag := "{tierlimit:fleet:" + name + "}"
	return []string{tag + ":est2", tag + ":seen2", tag + ":sum2"}
}

// pairLua reads an "IN TOTAL" value (or a single value, as IN = TOTAL);
// nil as 0 0.
const pairLua = `
local function pair(v)
  if not v then return 0, 0 end
  local a, b = string.match(v, '^(%d+) (%d+)$')
  if a then return tonumber(a), tonumber(b) end
  local x = tonumber(v) or 0
  return x, x
end
`

// reportScript writes ARGV[1]'s estimates ARGV[2] (in budget) and ARGV[3]
// (total) with the server's time, drops the members not heard from for
// ARGV[4] µs, refreshes the keys' expiry (ARGV[5] ms, so that a fleet with
// no member left vanishes), and returns {the others' in-budget sum, their
// total, the member count}. Integers go out through string.format('%d'):
// Lua numbers are doubles, exact below 2^53, which the caller keeps
// estimates under.
var reportScript = redis.NewScript(pairLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ein, etot = tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
if redis.call('HLEN', KEYS[1]) ~= redis.call('ZCARD', KEYS[2]) then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
end
local sin, stot
local s = redis.call('GET', KEYS[3])
if s then
  sin, stot = pair(s)
else
  sin, stot = 0, 0
  local vals = redis.call('HVALS', KEYS[1])
  for i = 1, #vals do
    local a, b = pair(vals[i])
    sin, stot = sin + a, stot + b
  end
end
local oin, otot = pair(redis.call('HGET', KEYS[1], ARGV[1]))
sin, stot = sin - oin + ein, stot - otot + etot
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
redis.call('ZADD', KEYS[2], string.format('%d', now), ARGV[1])
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%d', now - ttl))
for i = 1, #stale do
  local a, b = pair(redis.call('HGET', KEYS[1], stale[i]))
  sin, stot = sin - a, stot - b
  redis.call('HDEL', KEYS[1], stale[i])
  redis.call('ZREM', KEYS[2], stale[i])
end
if sin < ein then sin = ein end
if stot < etot then stot = etot end
redis.call('SET', KEYS[3], string.format('%d %d', sin, stot), 'PX', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {sin - ein, stot - etot, redis.call('ZCARD', KEYS[2])}
`)

// leaveScript removes member ARGV[1] and its estimates from the sums.
var leaveScript = redis.NewScript(pairLua + `
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local s = redis.call('GET', KEYS[3])
if s then
  local sin, stot = pair(s)
  local a, b = pair(v)
  sin, stot = math.max(sin - a, 0), math.max(stot - b, 0)
  redis.call('SET', KEYS[3], string.format('%d %d', sin, stot), 'KEEPTTL')
end
return 1
`)

// statusScript returns {server time µs, HGETALL :est, ZRANGE :seen WITHSCORES}
// in one round trip; it writes nothing.
var statusScript = redis.NewScript(`
local t = redis.call('TIME')
return {string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2])),
  redis.call('HGETALL', KEYS[1]),
  redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')}
`)

// maxEstimate bounds what a member reports: Lua numbers are doubles, and a
// sum of estimates must stay exact. No window holds 2^44 packets.
const maxEstimate = 1 << 44

// view is what one report returns.
type view struct {
	others  Sums
	members int
}

// report runs reportScript for member: one round trip (EVALSHA, or EVAL
// when the server does not hold the script yet).
func report(ctx context.Context, c redis.UniversalClient, name, member string, est Sums, ttl time.Duration) (view, error) {
	est.Total = min(est.Total, maxEstimate)
	est.In = min(est.In, est.Total)
	ttlUS := ttl.Microseconds()
	expireMS := 2 * ttl.Milliseconds()
	if expireMS < 1000 {
		expireMS = 1000
	}
	res, err := reportScript.Run(ctx, c, keys(name), member, strconv.FormatUint(est.In, 10),
		strconv.FormatUint(est.Total, 10), ttlUS, expireMS).Int64Slice()
	if err != nil {
		return view{}, err
	}
	if len(res) != 3 {
		return view{}, fmt.Errorf("fleet report script returned %d values, want 3", len(res))
	}
	v := view{members: int(res[2])}
	v.others.Total = uint64(max(res[1], 0))
	v.others.In = min(uint64(max(res[0], 0)), v.others.Total)
	return v, nil
}

// leave removes member from the fleet.
func leave(ctx context.Context, c redis.UniversalClient, name, member string) error {
	return leaveScript.Run(ctx, c, keys(name), member).Err()
}
