package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// redisStore is the store on Redis or Valkey (standalone, Sentinel or
// Cluster; TLS; ACL users): every scheme storeurl reads. Each call is one
// round trip of one server-side script (the scripts below).
type redisStore struct {
	su      storeurl.URL
	caFile  string
	timeout func() time.Duration // a new client's dial and command timeout: the report in force
	creds   func() (user, password string)

	mu     sync.Mutex
	client redis.UniversalClient // replaced after a connection failure; see redial
}

var _ store = (*redisStore)(nil)

// dialRedis returns the store at su (dial). Its errors are newClient's.
func dialRedis(su storeurl.URL, caFile string, timeout func() time.Duration, creds func() (string, string)) (*redisStore, error) {
	c, err := newClient(su, caFile, timeout(), creds)
	if err != nil {
		return nil, err
	}
	return &redisStore{su: su, caFile: caFile, timeout: timeout, creds: creds, client: c}, nil
}

func (s *redisStore) get() redis.UniversalClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

func (s *redisStore) report(ctx context.Context, name string, e entry) (view, error) {
	v, err := report(ctx, s.get(), name, e)
	s.redial(err)
	return v, refusal(err)
}

func (s *redisStore) leave(ctx context.Context, name string, e entry) error {
	return refusal(leaveScript.Run(ctx, s.get(), keys(name), e.field()).Err())
}

func (s *redisStore) members(ctx context.Context, name string) ([]Member, error) {
	return members(ctx, s.get(), name)
}

func (s *redisStore) close() error { return s.get().Close() }

// redial replaces the client after a report whose connection failed (a
// dial refused or timed out, a TLS handshake, a reset). go-redis stops
// dialing a node whose dials keep failing and probes it once a second; a
// fresh client dials at the next report, so that a member rejoins within
// a report or two of the store's return. Nothing is replaced after a reply,
// even an error reply, nor after a report that timed out on a connection
// that was up: go-redis drops that connection itself, and a new client
// for each slow report would add to the load of a store that is slow.
func (s *redisStore) redial(err error) {
	var reply redis.Error
	var op *net.OpError
	dial := errors.As(err, &op) && op.Op == "dial"
	if err == nil || errors.As(err, &reply) || (isTimeout(err) && !dial) {
		return
	}
	fresh, e := newClient(s.su, s.caFile, s.timeout(), s.creds)
	if e != nil {
		return // ca_file went away: keep the old client; Reload says why
	}
	s.mu.Lock()
	old := s.client
	s.client = fresh
	s.mu.Unlock()
	go old.Close() // may wait for a hung connection: never the loop
}

// refusal returns err as a refusedError when it is the store refusing the
// credentials or the ACL user's rights, else as it is.
func refusal(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, s := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "invalid password", "invalid username-password"} {
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

// newClient returns the go-redis client for s. creds returns the current
// user and password (password_file, read at start and on reload). Every
// command is bounded by its context's deadline (the report), with no
// retries: the next report is the retry.
func newClient(s storeurl.URL, caFile string, timeout time.Duration, creds func() (string, string)) (redis.UniversalClient, error) {
	opts := &redis.UniversalOptions{
		Addrs:                 s.Addrs,
		DB:                    s.DB,
		MasterName:            s.Master,
		IsClusterMode:         s.Cluster(),
		ClientName:            "tierlimit-fleet",
		CredentialsProvider:   creds,
		MaxRetries:            -1,
		DialerRetries:         1,
		DialTimeout:           timeout,
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		ContextTimeoutEnabled: true,
		PoolSize:              2,
		MinIdleConns:          0,
		DisableIdentity:       true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	if caFile != "" && !s.TLS() {
		return nil, fmt.Errorf("%w: ca_file is set but the store URL is not rediss://", ErrCAFile)
	}
	if s.TLS() {
		cfg, err := tlsConfig(caFile)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = cfg
	}
	quietOnce.Do(func() { redis.SetLogger(goRedisLog{}) })
	return redis.NewUniversalClient(opts), nil
}
