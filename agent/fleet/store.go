package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Default ports when the store URL names a host without one.
const (
	defaultPort         = "6379"
	defaultSentinelPort = "26379"
)

// storeURL is a parsed `fleet.store`.
type storeURL struct {
	kind     string // "redis", "sentinel" or "cluster"
	tls      bool
	username string // the ACL user the URL names, if any
	addrs    []string
	master   string // sentinel: the monitored master's name
	db       int
}

// parseStore parses a store URL (docs/design.md §12):
//
//	redis://[user@]host[:port][/db]
//	rediss://...                                   (TLS)
//	redis+sentinel://[user@]h1[:port],h2[:port]/master[/db]
//	redis+cluster://[user@]h1[:port],h2[:port],...
//
// rediss+sentinel:// and rediss+cluster:// are the TLS forms of the last
// two. The URL may name an ACL user but never a password: the secret comes
// from password_file only. Errors wrap ErrStoreURL.
func parseStore(raw string) (storeURL, error) {
	var s storeURL
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return s, fmt.Errorf("%w: %q has no scheme (redis://, rediss://, redis+sentinel://, redis+cluster://)", ErrStoreURL, redact(raw))
	}
	base, topo, _ := strings.Cut(scheme, "+")
	switch base {
	case "redis":
	case "rediss":
		s.tls = true
	default:
		return s, fmt.Errorf("%w: unknown scheme %q (redis, rediss, redis+sentinel, redis+cluster)", ErrStoreURL, scheme)
	}
	switch topo {
	case "":
		s.kind = "redis"
	case "sentinel", "cluster":
		s.kind = topo
	default:
		return s, fmt.Errorf("%w: unknown scheme %q (redis, rediss, redis+sentinel, redis+cluster)", ErrStoreURL, scheme)
	}
	if strings.ContainsAny(rest, "?#") {
		return s, fmt.Errorf("%w: %s: query and fragment are not supported", ErrStoreURL, redact(raw))
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		user := hosts[:at]
		hosts = hosts[at+1:]
		if strings.Contains(user, ":") {
			return s, fmt.Errorf("%w: %s names a password; put the secret in password_file", ErrStoreURL, redact(raw))
		}
		u, err := url.PathUnescape(user)
		if err != nil {
			return s, fmt.Errorf("%w: user in %s: %v", ErrStoreURL, redact(raw), err)
		}
		s.username = u
	}
	port := defaultPort
	if s.kind == "sentinel" {
		port = defaultSentinelPort
	}
	for _, h := range strings.Split(hosts, ",") {
		addr, err := hostPort(h, port)
		if err != nil {
			return s, fmt.Errorf("%w: %s: %v", ErrStoreURL, redact(raw), err)
		}
		s.addrs = append(s.addrs, addr)
	}
	if s.kind == "redis" && len(s.addrs) > 1 {
		return s, fmt.Errorf("%w: %s lists %d hosts; use redis+sentinel:// or redis+cluster:// for several", ErrStoreURL, redact(raw), len(s.addrs))
	}
	parts := strings.Split(strings.TrimSuffix(path, "/"), "/")
	if path == "" || path == "/" {
		parts = nil
	}
	if s.kind == "sentinel" {
		if len(parts) == 0 || parts[0] == "" {
			return s, fmt.Errorf("%w: %s: a sentinel URL names the master: redis+sentinel://h1,h2/master", ErrStoreURL, redact(raw))
		}
		s.master, parts = parts[0], parts[1:]
	}
	switch {
	case len(parts) == 0:
	case len(parts) == 1 && s.kind != "cluster":
		db, err := strconv.Atoi(parts[0])
		if err != nil || db < 0 {
			return s, fmt.Errorf("%w: %s: database %q is not a number", ErrStoreURL, redact(raw), parts[0])
		}
		s.db = db
	default:
		return s, fmt.Errorf("%w: %s: unexpected path %q", ErrStoreURL, redact(raw), "/"+path)
	}
	return s, nil
}

// hostPort validates one host of a store URL and adds the default port.
func hostPort(h, port string) (string, error) {
	if h == "" {
		return "", errors.New("empty host")
	}
	if host, p, err := net.SplitHostPort(h); err == nil {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("bad port in %q", h)
		}
		if host == "" {
			return "", fmt.Errorf("empty host in %q", h)
		}
		return h, nil
	}
	if strings.Count(h, ":") > 1 && !strings.HasPrefix(h, "[") {
		return net.JoinHostPort(h, port), nil // a bare IPv6 address
	}
	if strings.ContainsAny(h, ":[]") {
		return "", fmt.Errorf("bad host %q", h)
	}
	return net.JoinHostPort(h, port), nil
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

// readPassword reads password_file: its content with surrounding white
// space trimmed. Errors wrap ErrPasswordFile and never quote the content.
func readPassword(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrPasswordFile, err)
	}
	pw := strings.TrimSpace(string(b))
	if pw == "" {
		return "", fmt.Errorf("%w: %s is empty", ErrPasswordFile, file)
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
func newClient(s storeURL, caFile string, timeout time.Duration, creds func() (string, string)) (redis.UniversalClient, error) {
	opts := &redis.UniversalOptions{
		Addrs:                 s.addrs,
		DB:                    s.db,
		MasterName:            s.master,
		IsClusterMode:         s.kind == "cluster",
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
	if caFile != "" && !s.tls {
		return nil, fmt.Errorf("%w: ca_file is set but the store URL is not rediss://", ErrCAFile)
	}
	if s.tls {
		cfg, err := tlsConfig(caFile)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = cfg
	}
	quietOnce.Do(func() { redis.SetLogger(goRedisLog{}) })
	return redis.NewUniversalClient(opts), nil
}
