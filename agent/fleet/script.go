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
//	{tierlimit:fleet:NAME}:est   hash   member -> last reported R̂ (packets per window)
//	{tierlimit:fleet:NAME}:seen  zset   member -> server time of its last report (µs)
//	{tierlimit:fleet:NAME}:sum   string the sum of :est, kept by the scripts
//
// The sum makes a report O(log members) instead of O(members): a store of
// 1,000 members at 10 reports per second each must not walk the hash
// 10,000 times a second. A script that finds the keys out of step (one
// expired alone, a flush) rebuilds the sum from :est or starts over.
func keys(name string) []string {
	tag := "{tierlimit:fleet:" + name + "}"
	return []string{tag + ":est", tag + ":seen", tag + ":sum"}
}

// reportScript writes ARGV[1]'s estimate ARGV[2] with the server's time,
// drops the members not heard from for ARGV[3] µs, refreshes the keys'
// expiry (ARGV[4] ms, so that a fleet with no member left vanishes), and
// returns {the others' sum, the member count}. Integers go out through
// string.format('%d'): Lua numbers are doubles, exact below 2^53, which
// the caller keeps estimates under.
var reportScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local est = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
if redis.call('HLEN', KEYS[1]) ~= redis.call('ZCARD', KEYS[2]) then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
end
local sum
local s = redis.call('GET', KEYS[3])
if s then
  sum = tonumber(s)
else
  sum = 0
  local vals = redis.call('HVALS', KEYS[1])
  for i = 1, #vals do sum = sum + tonumber(vals[i]) end
end
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then sum = sum - tonumber(old) end
sum = sum + est
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], string.format('%d', now), ARGV[1])
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%d', now - ttl))
for i = 1, #stale do
  local v = redis.call('HGET', KEYS[1], stale[i])
  if v then sum = sum - tonumber(v) end
  redis.call('HDEL', KEYS[1], stale[i])
  redis.call('ZREM', KEYS[2], stale[i])
end
if sum < est then sum = est end
redis.call('SET', KEYS[3], string.format('%d', sum), 'PX', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {sum - est, redis.call('ZCARD', KEYS[2])}
`)

// leaveScript removes member ARGV[1] and its estimate from the sum.
var leaveScript = redis.NewScript(`
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('DECRBY', KEYS[3], v)
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
	others  uint64
	members int
}

// report runs reportScript for member: one round trip (EVALSHA, or EVAL
// when the server does not hold the script yet).
func report(ctx context.Context, c redis.UniversalClient, name, member string, est uint64, ttl time.Duration) (view, error) {
	if est > maxEstimate {
		est = maxEstimate
	}
	ttlUS := ttl.Microseconds()
	expireMS := 2 * ttl.Milliseconds()
	if expireMS < 1000 {
		expireMS = 1000
	}
	res, err := reportScript.Run(ctx, c, keys(name), member, strconv.FormatUint(est, 10), ttlUS, expireMS).Int64Slice()
	if err != nil {
		return view{}, err
	}
	if len(res) != 2 {
		return view{}, fmt.Errorf("fleet report script returned %d values, want 2", len(res))
	}
	v := view{members: int(res[1])}
	if res[0] > 0 {
		v.others = uint64(res[0])
	}
	return v, nil
}

// leave removes member from the fleet.
func leave(ctx context.Context, c redis.UniversalClient, name, member string) error {
	return leaveScript.Run(ctx, c, keys(name), member).Err()
}
