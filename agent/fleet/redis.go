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

func (s *redisStore) report(ctx context.Context, name string, e entry) (view, error) {
	now := time.Now()
	s.follow(now)
	before, err := s.gate.wait(now, s.files)
	if err != nil {
		return view{}, err
	}
	v, err := report(ctx, s.get(), name, e)
	err = refusal(err)
	s.gate.done(time.Now(), s.o.report(), err, before, s.files)
	if countsAsFailure(err) {
		s.sentinelChanged()
	}
	return v, err
}

func (s *redisStore) leave(ctx context.Context, name string, e entry) error {
	return refusal(leaveScript.Run(ctx, s.get(), keys(name), e.field()).Err())
}

func (s *redisStore) members(ctx context.Context, name string) ([]Member, error) {
	return members(ctx, s.get(), name)
}

func (s *redisStore) license(ctx context.Context, name string, days [3]span) (int, LicenseDay, error) {
	i, d, err := licenseDay(ctx, s.get(), name, days)
	return i, d, refusal(err)
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
