package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/tierlimit/tierlimit/tiers"
)

// parseStore reads a store URL with tiers.ParseStore (docs/design.md §12:
// redis://, rediss://, redis+sentinel://h1,h2/master, redis+cluster://h1,h2,h3
// and the rediss+ forms; an ACL user but never a password). Errors wrap
// ErrStoreURL and never repeat the URL.
func parseStore(raw string) (tiers.StoreURL, error) {
	u, err := tiers.ParseStore(raw)
	if err != nil {
		return u, fmt.Errorf("%w: %v", ErrStoreURL, err)
	}
	return u, nil
}

// redact drops anything between "://" and "@" (a user, or a password that
// has no business in the URL) so that errors and logs never carry it.
func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	hosts, path, slash := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		hosts = "xxx@" + hosts[at+1:]
	}
	if slash {
		return scheme + "://" + hosts + "/" + path
	}
	return scheme + "://" + hosts
}

// readPassword reads password_file as the agent does (tiers.ReadPasswordFile:
// the content less one trailing line break). Errors wrap ErrPasswordFile
// and never quote the content.
func readPassword(file string) (string, error) {
	pw, err := tiers.ReadPasswordFile(file, os.ReadFile)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrPasswordFile, err)
	}
	return pw, nil
}

// tlsConfig builds the client's TLS settings: the system roots, or the CA
// in caFile when given; each server's name is checked against the host the
// client dials (crypto/tls takes it from the address). Errors wrap
// ErrCAFile.
func tlsConfig(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCAFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrCAFile, caFile)
	}
	cfg.RootCAs = pool
	return cfg, nil
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
func newClient(s tiers.StoreURL, caFile string, timeout time.Duration, creds func() (string, string)) (redis.UniversalClient, error) {
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
