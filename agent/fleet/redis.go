package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisStore is the store on Redis or Valkey (standalone, Sentinel or
// Cluster; TLS; ACL users): every scheme storeurl reads. Each call is one
// round trip of one server-side script (the scripts below). Its client is
// built once (dial.go); reports that fail back off (backoff.go).
type redisStore struct {
	o    *connOptions
	d    *dialer
	gate backoff

	mu         sync.Mutex
	client     redis.UniversalClient // replaced only when a name moved or the Sentinels' password changed
	sentinelPW []byte                // sentinel_password_file's content when client was built
	resolvedAt time.Time             // when the host names were last resolved (or dialled)
	resolving  bool
}

var _ store = (*redisStore)(nil)

// dialRedis returns the store o names (dial). Its errors are newClient's.
func dialRedis(o *connOptions) (*redisStore, error) {
	d := &dialer{o: o, used: map[string]string{}}
	c, err := newClient(o, d)
	if err != nil {
		return nil, err
	}
	s := &redisStore{o: o, d: d, client: c, resolvedAt: time.Now()}
	s.sentinelPW = readFile(o.cfg.SentinelPasswordFile)
	return s, nil
}

func (s *redisStore) get() redis.UniversalClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

func (s *redisStore) files() []byte { return fingerprint(s.o.cfg) }

func (s *redisStore) report(ctx context.Context, name, member string, est Sums, ttl time.Duration) (view, error) {
	now := time.Now()
	s.follow(now)
	if err := s.gate.wait(now, s.files); err != nil {
		return view{}, err
	}
	v, err := report(ctx, s.get(), name, member, est, ttl)
	err = refusal(err)
	s.gate.done(time.Now(), s.o.report(), err, s.files)
	if countsAsFailure(err) {
		s.sentinelChanged()
	}
	return v, err
}

func (s *redisStore) leave(ctx context.Context, name, member string) error {
	return refusal(leaveScript.Run(ctx, s.get(), keys(name), member).Err())
}

func (s *redisStore) members(ctx context.Context, name string) ([]Member, error) {
	return members(ctx, s.get(), name)
}

func (s *redisStore) close() error { return s.get().Close() }

// follow resolves the store's host names again in the background when
// the last resolution is older than the ttl in force (within
// [minResolveEvery, resolveEvery]); a name that resolves elsewhere than its
// connections were dialled to replaces the client, so that the next report
// dials the new address (docs/design.md §12, "Connections").
func (s *redisStore) follow(now time.Time) {
	every := min(max(s.o.ttl(), minResolveEvery), resolveEvery)
	s.mu.Lock()
	due := !s.resolving && now.Sub(s.resolvedAt) >= every
	if due {
		s.resolving = true
	}
	s.mu.Unlock()
	if !due {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.d.timeout())
		host, moved := s.d.moved(ctx)
		cancel()
		if moved {
			s.o.log.Info("fleet store host name resolves elsewhere: reconnecting", "host", host)
			s.rebuild()
		}
		s.mu.Lock()
		s.resolving, s.resolvedAt = false, time.Now()
		s.mu.Unlock()
	}()
}

// sentinelChanged replaces the client after a failure when
// sentinel_password_file changed since it was built: go-redis takes the
// Sentinels' password once, at the client's construction.
func (s *redisStore) sentinelChanged() {
	if s.o.cfg.SentinelPasswordFile == "" {
		return
	}
	pw := readFile(s.o.cfg.SentinelPasswordFile)
	s.mu.Lock()
	same := bytes.Equal(pw, s.sentinelPW)
	s.mu.Unlock()
	if !same {
		s.rebuild()
	}
}

// rebuild replaces the client with a new one; the old one is closed in
// the background (it may wait for a hung connection: never the loop).
func (s *redisStore) rebuild() {
	fresh, err := newClient(s.o, s.d)
	if err != nil {
		return // a file went away: keep the old client; the next failure says why
	}
	s.mu.Lock()
	old := s.client
	s.client = fresh
	s.sentinelPW = readFile(s.o.cfg.SentinelPasswordFile)
	s.mu.Unlock()
	go old.Close()
}

// readFile returns file's content, nil when it is "" or unreadable.
func readFile(file string) []byte {
	if file == "" {
		return nil
	}
	b, _ := os.ReadFile(file)
	return b
}

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

// parsePair reads a value of :est2, "IN TOTAL", or a single value as
// IN = TOTAL (pairLua).
func parsePair(v string) (in, total uint64) {
	a, b, ok := strings.Cut(v, " ")
	in, _ = strconv.ParseUint(a, 10, 64)
	if !ok {
		return in, in
	}
	total, _ = strconv.ParseUint(b, 10, 64)
	return min(in, total), total
}

// members reads the fleet's members with statusScript, in no order.
func members(ctx context.Context, c redis.UniversalClient, name string) ([]Member, error) {
	res, err := statusScript.Run(ctx, c, keys(name)).Slice()
	if err != nil {
		return nil, fmt.Errorf("fleet %s status: %w", name, refusal(err))
	}
	if len(res) != 3 {
		return nil, fmt.Errorf("fleet %s status: the script returned %d values, want 3", name, len(res))
	}
	nowS, _ := res[0].(string)
	now, err := strconv.ParseInt(nowS, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("fleet %s status: server time %q: %v", name, nowS, err)
	}
	est, _ := res[1].([]any)
	seen, _ := res[2].([]any)
	byName := map[string]*Member{}
	for i := 0; i+1 < len(est); i += 2 {
		n, _ := est[i].(string)
		v, _ := est[i+1].(string)
		in, tot := parsePair(v)
		byName[n] = &Member{Name: n, Estimate: tot, In: in}
	}
	for i := 0; i+1 < len(seen); i += 2 {
		n, _ := seen[i].(string)
		s, _ := seen[i+1].(string)
		at, err := strconv.ParseFloat(s, 64)
		m := byName[n]
		if m == nil || err != nil {
			continue
		}
		m.Heard = time.UnixMicro(int64(at))
		m.Age = time.Duration(now-int64(at)) * time.Microsecond
	}
	out := make([]Member, 0, len(byName))
	for _, m := range byName {
		out = append(out, *m)
	}
	return out, nil
}

// refusal returns err as a refusedError when it is the store refusing the
// credentials or the ACL user's rights, or a TLS certificate refused
// either way (the server's not verified, or ours refused by the server's
// alert), else as it is.
func refusal(err error) error {
	if err == nil {
		return nil
	}
	var verify *tls.CertificateVerificationError
	var host x509.HostnameError
	var ca x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &verify) || errors.As(err, &host) || errors.As(err, &ca) || errors.As(err, &invalid) {
		return refusedError{err}
	}
	msg := err.Error()
	for _, s := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "invalid password", "invalid username-password",
		"remote error: tls: bad certificate", "remote error: tls: certificate required", "remote error: tls: unknown certificate"} {
		if strings.Contains(msg, s) {
			return refusedError{err}
		}
	}
	return err
}

// goRedisLog sends go-redis's own messages (dial failures, at every
// report while the store is down) to slog's default logger at debug level.
type goRedisLog struct{}

func (goRedisLog) Printf(ctx context.Context, format string, v ...any) {
	slog.Default().DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

var quietOnce sync.Once
