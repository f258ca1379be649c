package fleet

import "github.com/redis/go-redis/v9"

// v2ReportScript is the report script before instances, per-entry ttls
// and rebuilt sums (keys :est2, :seen2, :sum2): TestFleetPerfStore runs
// it beside reportScript as its same-run baseline. ARGV: member, R̂_in,
// R̂_tot, ttl µs, expiry ms.
var v2ReportScript = redis.NewScript(`
local function pair(v)
  if not v then return 0, 0 end
  local a, b = string.match(v, '^(%d+) (%d+)$')
  if a then return tonumber(a), tonumber(b) end
  local x = tonumber(v) or 0
  return x, x
end
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
