// Package storeurl is the grammar of a fleet store URL (docs/design.md §12):
// Parse reads one, Redact renders one for a person or a log, and
// ReadPassword reads the password_file that goes with it. It is pure Go
// and imports nothing of the module, so that tiers validates a policy with
// it and agent/fleet and cmd read and show the same URL the same way.
package storeurl

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Store schemes (docs/design.md §12); the rediss ones speak TLS.
const (
	SchemeRedis       = "redis"
	SchemeRedisTLS    = "rediss"
	SchemeSentinel    = "redis+sentinel"
	SchemeSentinelTLS = "rediss+sentinel"
	SchemeCluster     = "redis+cluster"
	SchemeClusterTLS  = "rediss+cluster"
)

// URL is a fleet store URL, read by Parse.
type URL struct {
	// Scheme is one of SchemeRedis, SchemeRedisTLS, SchemeSentinel,
	// SchemeSentinelTLS, SchemeCluster, SchemeClusterTLS.
	Scheme string
	// Addrs are HOST:PORT, with the scheme's default port where the URL
	// gave none (6379; 26379 for Sentinel): one for redis:// and rediss://,
	// the Sentinels or the Cluster's seed nodes otherwise.
	Addrs []string
	// Username is the ACL user written before an @, or "" for default.
	Username string
	// DB is the database number (redis://, rediss://, Sentinel); always 0
	// for a Cluster.
	DB int
	// Master is the Sentinel master's name.
	Master string
}

// TLS reports whether the store is reached over TLS (rediss://,
// rediss+sentinel://, rediss+cluster://).
func (s URL) TLS() bool { return strings.HasPrefix(s.Scheme, "rediss") }

// Sentinel reports whether the store is found through Sentinels.
func (s URL) Sentinel() bool { return strings.HasSuffix(s.Scheme, "+sentinel") }

// Cluster reports whether the store is a Redis Cluster.
func (s URL) Cluster() bool { return strings.HasSuffix(s.Scheme, "+cluster") }

// Forms is what a store error says is wanted.
const Forms = "want redis://HOST[:PORT][/DB], redis+sentinel://H1,H2/MASTER[/DB] or redis+cluster://H1,H2,H3 (rediss for TLS)"

// Parse reads a fleet store URL: redis://[USER@]HOST[:PORT][/DB],
// redis+sentinel://[USER@]H1[:PORT],H2.../MASTER[/DB] or
// redis+cluster://[USER@]H1[:PORT],H2,H3; rediss, rediss+sentinel and
// rediss+cluster are the same over TLS. A URL with a password, a
// query or a fragment is refused: the secret goes in password_file. The
// error never repeats the URL (it may hold a secret).
func Parse(s string) (URL, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	var u URL
	switch scheme {
	case SchemeRedis, SchemeRedisTLS, SchemeSentinel, SchemeSentinelTLS, SchemeCluster, SchemeClusterTLS:
		u.Scheme = scheme
	default:
		if !ok {
			return URL{}, errors.New(Forms)
		}
		return URL{}, fmt.Errorf("unknown scheme %q: %s", scheme, Forms)
	}
	if strings.ContainsAny(rest, "?#") {
		return URL{}, fmt.Errorf("a query or fragment: %s", Forms)
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		user := hosts[:at]
		hosts = hosts[at+1:]
		if strings.Contains(user, ":") {
			return URL{}, errors.New("the URL holds a password: put it in password_file, never in the policy")
		}
		u.Username = user
	}
	port := "6379"
	if u.Sentinel() {
		port = "26379"
	}
	for _, h := range strings.Split(hosts, ",") {
		addr, err := hostPort(h, port)
		if err != nil {
			return URL{}, err
		}
		u.Addrs = append(u.Addrs, addr)
	}
	if len(u.Addrs) > 1 && !u.Sentinel() && !u.Cluster() {
		return URL{}, fmt.Errorf("%s:// takes one host; for several use redis+sentinel:// or redis+cluster://", scheme)
	}
	parts := strings.Split(path, "/")
	if path == "" {
		parts = nil
	}
	switch {
	case u.Sentinel():
		if len(parts) == 0 || parts[0] == "" {
			return URL{}, errors.New("redis+sentinel:// needs the master's name: redis+sentinel://H1,H2/MASTER")
		}
		u.Master, parts = parts[0], parts[1:]
	case u.Cluster():
		if len(parts) > 0 {
			return URL{}, errors.New("redis+cluster:// takes no path: a Cluster has database 0 only")
		}
	}
	if len(parts) > 1 {
		return URL{}, fmt.Errorf("a path of more than a database number: %s", Forms)
	}
	if len(parts) == 1 {
		db, err := strconv.Atoi(parts[0])
		if err != nil || db < 0 || db > 1<<20 || parts[0] != strconv.Itoa(db) {
			return URL{}, fmt.Errorf("database %q: want a number from 0", parts[0])
		}
		u.DB = db
	}
	return u, nil
}

// hostPort is HOST:PORT of one host of a store URL, with port as the
// default.
func hostPort(h, port string) (string, error) {
	if h == "" {
		return "", fmt.Errorf("a host is empty: %s", Forms)
	}
	host, p := h, port
	if strings.HasPrefix(h, "[") || strings.Count(h, ":") == 1 {
		var err error
		if strings.HasPrefix(h, "[") && !strings.Contains(h, "]:") {
			h += ":" + port
		}
		if host, p, err = net.SplitHostPort(h); err != nil {
			return "", fmt.Errorf("host %q: %v", h, err)
		}
	} else if strings.Contains(h, ":") {
		return "", fmt.Errorf("host %q: write an IPv6 address in brackets, [::1]:6379", h)
	}
	if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("host %q: want a port from 1 to 65535", h)
	}
	if host == "" {
		return "", fmt.Errorf("host %q: no host name", h)
	}
	return net.JoinHostPort(host, p), nil
}

// unreadable is what Redact shows of a URL that Parse refuses.
const unreadable = "(the fleet.store URL)"

// Redact is the store URL s as logs, errors and status show it: the scheme
// and the hosts as Parse reads them (HOST:PORT), never a user, a path or
// anything else the URL may hold; "(the fleet.store URL)" when Parse refuses s (it may
// hold a password).
func Redact(s string) string {
	u, err := Parse(s)
	if err != nil {
		return unreadable
	}
	return u.Scheme + "://" + strings.Join(u.Addrs, ",")
}

// ErrEmptyPassword: a password file that holds nothing but a line break.
var ErrEmptyPassword = errors.New("the file is empty")

// ReadPassword reads the store's password from path with read (os.ReadFile
// outside tests), as the agent does at start and on reload: the file's
// content less one trailing line break (\n or \r\n). It returns read's
// error as it is, or ErrEmptyPassword; an error never holds the content.
func ReadPassword(path string, read func(string) ([]byte, error)) (string, error) {
	b, err := read(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", ErrEmptyPassword
	}
	return s, nil
}
