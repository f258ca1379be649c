package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// A connection's lifecycle (docs/design.md §12, "Connections"): one
// go-redis client per store, built once and kept; a new one only when a
// store host name resolves elsewhere (resolveEvery) or the Sentinels'
// password file changed after a failure. Its connections live as long as
// the store keeps them: a report's deadline (report) is the controller's
// wait, not the connection's (inflight.go); an operation is bounded by
// ttl, a dial by dialTimeout. Every file (password, certificate, key, CA)
// is read again at each new connection, so that a rotated one applies at
// the next reconnect without a reload.

// Bounds of a connection (docs/design.md §12, "Connections").
const (
	// maxDialTimeout bounds a dial (TCP and the name's resolution): the
	// ttl in force, at most this.
	maxDialTimeout = 5 * time.Second
	// resolveEvery is the longest time between two resolutions of the
	// store's host names while connections stay up: the ttl in force, at
	// least minResolveEvery, at most this.
	resolveEvery    = 30 * time.Second
	minResolveEvery = time.Second
)

// connOptions is what a client of the store is built from.
type connOptions struct {
	su storeurl.URL
	// files and names of Config: CAFile, CertFile, KeyFile, ServerName,
	// SentinelUser, SentinelPasswordFile, Resolver.
	cfg Config
	// report and ttl return the settings in force: report is the first
	// step of the reconnection backoff; ttl an operation's read and write
	// deadline, the dial's (at most maxDialTimeout) and the period of the
	// resolution of the host names (within [minResolveEvery, resolveEvery]).
	report, ttl func() time.Duration
	// creds returns the ACL user and password for a new connection.
	creds func(ctx context.Context) (user, password string, err error)
	// dials counts every dial (fleet_store_dials_total).
	dials *atomic.Uint64
	log   *slog.Logger
}

// checkConn checks the connection settings of cfg against su before any
// dial: errors wrap ErrCAFile, ErrCertFile or ErrSentinelPasswordFile.
func checkConn(su storeurl.URL, cfg Config) error {
	if cfg.CAFile != "" && !su.TLS() {
		return fmt.Errorf("%w: ca_file is set but the store URL is not rediss://", ErrCAFile)
	}
	if cfg.CertFile != "" && !su.TLS() {
		return fmt.Errorf("%w: cert_file is set but the store URL is not rediss://", ErrCertFile)
	}
	if cfg.ServerName != "" && !su.TLS() {
		return fmt.Errorf("%w: server_name %q is set but the store URL is not rediss://", ErrConfig, cfg.ServerName)
	}
	if (cfg.SentinelPasswordFile != "" || cfg.SentinelUser != "") && !su.Sentinel() {
		return fmt.Errorf("%w: set for a store that is not redis+sentinel:// or rediss+sentinel://", ErrSentinelPasswordFile)
	}
	if su.TLS() {
		if _, err := tlsConfig(cfg, "check"); err != nil {
			return err
		}
	}
	if cfg.SentinelPasswordFile != "" {
		if _, err := readSentinelPassword(cfg.SentinelPasswordFile); err != nil {
			return err
		}
	}
	return nil
}

// readSentinelPassword reads sentinel_password_file as password_file is
// read. Errors wrap ErrSentinelPasswordFile and never quote the content.
func readSentinelPassword(file string) (string, error) {
	pw, err := storeurl.ReadPassword(file, os.ReadFile)
	if errors.Is(err, storeurl.ErrEmptyPassword) {
		err = fmt.Errorf("%s: %w", file, err)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrSentinelPasswordFile, err)
	}
	return pw, nil
}

// dialer opens the store's connections: it resolves the host with the
// resolver given (each dial, so a name that moved is followed at the next
// reconnect), records what each name resolved to (moved), and wraps TLS
// with settings read from the files at this dial.
type dialer struct {
	o *connOptions

	mu   sync.Mutex
	used map[string]string // host name -> the address its last dial connected to
}

func (d *dialer) resolver() *net.Resolver {
	if d.o.cfg.Resolver != nil {
		return d.o.cfg.Resolver
	}
	return net.DefaultResolver
}

// timeout is a dial's: the ttl in force, at most maxDialTimeout.
func (d *dialer) timeout() time.Duration { return min(d.o.ttl(), maxDialTimeout) }

// dial is go-redis's Dialer. The TLS handshake is left to the
// connection's first write (go-redis's HELLO), under that command's
// deadline, so that a certificate refused is a refusal of the connection
// (refusal), not a dial error that go-redis would answer by stopping
// dials for a second.
func (d *dialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.o.dials.Add(1)
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	ips := []string{host}
	name := net.ParseIP(host) == nil
	if name {
		if ips, err = d.resolver().LookupHost(ctx, host); err != nil {
			return nil, err
		}
	}
	var nd net.Dialer
	var conn net.Conn
	for _, ip := range ips {
		if conn, err = nd.DialContext(ctx, network, net.JoinHostPort(ip, port)); err == nil {
			if name {
				d.mu.Lock()
				d.used[host] = ip
				d.mu.Unlock()
			}
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if !d.o.su.TLS() {
		return conn, nil
	}
	cfg, err := tlsConfig(d.o.cfg, host)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return alertConn{tls.Client(conn, cfg)}, nil
}

// moved resolves every host name the dialer has dialled and reports
// whether one no longer resolves to the address its last dial connected
// to (a name with several addresses may list them in any order, or some
// of them: only the one in use matters).
func (d *dialer) moved(ctx context.Context) (string, bool) {
	d.mu.Lock()
	used := make(map[string]string, len(d.used))
	for h, a := range d.used {
		used[h] = a
	}
	d.mu.Unlock()
	for h, ip := range used {
		now, err := d.resolver().LookupHost(ctx, h)
		if err != nil || len(now) == 0 {
			continue // a name that does not resolve now: the connections stay
		}
		if !slices.Contains(now, ip) {
			return h, true
		}
	}
	return "", false
}

// tlsConfig builds the client's TLS settings for a connection to host,
// from the files as they are now: the system roots, or the CA in CAFile
// when given; the client certificate of CertFile and KeyFile when given;
// each server's certificate checked against ServerName, or host.
// Errors wrap ErrCAFile or ErrCertFile.
func tlsConfig(cfg Config, host string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if cfg.ServerName != "" {
		c.ServerName = cfg.ServerName
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrCAFile, cfg.CAFile)
		}
		c.RootCAs = pool
	}
	if cfg.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s and key_file %s: %v", ErrCertFile, cfg.CertFile, cfg.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// fingerprint is the content of every file a connection reads (password,
// Sentinel password, certificate, key, CA): a refused connection is tried
// again at once when it changed (a rotation), else after the backoff.
func fingerprint(cfg Config) []byte {
	var b bytes.Buffer
	for _, f := range []string{cfg.PasswordFile, cfg.SentinelPasswordFile, cfg.CertFile, cfg.KeyFile, cfg.CAFile} {
		if f != "" {
			c, _ := os.ReadFile(f)
			b.Write(c)
		}
		b.WriteByte(0)
	}
	return b.Bytes()
}

// newClient returns the go-redis client for o. Every command is bounded by
// its context's deadline (the controller's: ttl), with no retries: the
// next report is the retry. Its errors are checkConn's.
func newClient(o *connOptions, d *dialer) (redis.UniversalClient, error) {
	if err := checkConn(o.su, o.cfg); err != nil {
		return nil, err
	}
	s := o.su
	ttl := o.ttl()
	opts := &redis.UniversalOptions{
		Addrs:                      s.Addrs,
		DB:                         s.DB,
		MasterName:                 s.Master,
		IsClusterMode:              s.Cluster(),
		ClientName:                 "tierlimit-fleet",
		CredentialsProviderContext: o.creds,
		SentinelUsername:           o.cfg.SentinelUser,
		Dialer:                     d.dial,
		MaxRetries:                 -1,
		DialerRetries:              1,
		DialTimeout:                d.timeout(),
		ReadTimeout:                ttl,
		WriteTimeout:               ttl,
		ContextTimeoutEnabled:      true,
		PoolSize:                   2,
		MinIdleConns:               0,
		DisableIdentity:            true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	if o.cfg.SentinelPasswordFile != "" {
		pw, err := readSentinelPassword(o.cfg.SentinelPasswordFile)
		if err != nil {
			return nil, err
		}
		opts.SentinelPassword = pw
	}
	quietOnce.Do(func() { redis.SetLogger(goRedisLog{}) })
	return redis.NewUniversalClient(opts), nil
}
