package tiers

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ErrFleet: a fleet setting (docs/design.md §12) that is out of range or
// inconsistent: a name that is not 1-64 of [A-Za-z0-9._-], a store URL
// that is not one of the four forms (or holds a password), a report or
// ttl that is not positive or a report not under ttl, a relative
// password_file or ca_file, a ca_file for a store without TLS, a fallback other
// than share or local, or fleet with the ordinal shape.
var ErrFleet = errors.New("bad fleet setting")

// Defaults of the fleet block.
const (
	// DefaultFleetReport is how often a member reports by default.
	DefaultFleetReport = 100 * time.Millisecond
	// DefaultFleetTTL is how long a member not heard from stays in the
	// fleet by default.
	DefaultFleetTTL = 3 * time.Second
	// MaxFleetTTL is the longest ttl (and so the longest report).
	MaxFleetTTL = time.Hour
)

// FleetFallback is what a member applies once the store has been out of
// reach for ttl (docs/design.md §12).
type FleetFallback uint8

const (
	// FallbackShare judges on fleet.max ÷ the members last seen (the
	// default).
	FallbackShare FleetFallback = iota
	// FallbackLocal judges on the policy's own max.
	FallbackLocal
)

// String returns "share" or "local".
func (f FleetFallback) String() string {
	switch f {
	case FallbackShare:
		return "share"
	case FallbackLocal:
		return "local"
	}
	return "fallback(" + strconv.Itoa(int(f)) + ")"
}

// Fleet is the `fleet:` block (docs/design.md §12): one budget per window,
// Max, across the members with the same Name and Store. A policy with a
// Fleet judges on the table compiled for Fleet.Max (Policy.TableMax), on the
// fleet's estimate: its own live R̂ plus the others' last reported sum,
// which the agent writes into the program (bpf.Limiter.SetFleetOthers).
// The secret is never here: only the path of the file that holds it.
type Fleet struct {
	// Name names the fleet: members with the same name and store share one
	// budget. 1-64 of [A-Za-z0-9._-], so that it can be part of a store
	// key and of a Redis Cluster hash tag.
	Name string
	// Store is the store's URL as written (ParseStore reads it):
	// redis://, rediss://, redis+sentinel://h1,h2/master or
	// redis+cluster://h1,h2,h3, and rediss+sentinel:// and rediss+cluster://
	// over TLS.
	Store string
	// PasswordFile is the absolute path of the file that holds the store's
	// password, or "". The agent reads it at start and on reload
	// (ReadPasswordFile); tiers never opens it.
	PasswordFile string
	// CAFile is the absolute path of the CA bundle that verifies a TLS
	// store (rediss...), or "" for the system's roots.
	CAFile string
	// Max is the fleet's budget, packets per window: the tiers apply to it
	// as to a local max.
	Max uint64
	// Report is how often a member publishes its estimate and reads the
	// others'; TTL how long a member not heard from stays in the fleet,
	// and how long a member keeps its last view before its Fallback.
	Report, TTL time.Duration
	// Fallback is applied while the store is out of reach for TTL.
	Fallback FleetFallback
}

// Store schemes (docs/design.md §12); the rediss ones speak TLS.
const (
	StoreRedis       = "redis"
	StoreRedisTLS    = "rediss"
	StoreSentinel    = "redis+sentinel"
	StoreSentinelTLS = "rediss+sentinel"
	StoreCluster     = "redis+cluster"
	StoreClusterTLS  = "rediss+cluster"
)

// StoreURL is a fleet store URL, read by ParseStore.
type StoreURL struct {
	// Scheme is one of StoreRedis, StoreRedisTLS, StoreSentinel,
	// StoreSentinelTLS, StoreCluster, StoreClusterTLS.
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
func (s StoreURL) TLS() bool { return strings.HasPrefix(s.Scheme, "rediss") }

// Sentinel reports whether the store is found through Sentinels.
func (s StoreURL) Sentinel() bool { return strings.HasSuffix(s.Scheme, "+sentinel") }

// Cluster reports whether the store is a Redis Cluster.
func (s StoreURL) Cluster() bool { return strings.HasSuffix(s.Scheme, "+cluster") }

var fleetNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// storeForms is what a store error says is wanted.
const storeForms = "want redis://HOST[:PORT][/DB], redis+sentinel://H1,H2/MASTER[/DB] or redis+cluster://H1,H2,H3 (rediss for TLS)"

// ParseStore reads a fleet store URL: redis://[USER@]HOST[:PORT][/DB],
// redis+sentinel://[USER@]H1[:PORT],H2.../MASTER[/DB] or
// redis+cluster://[USER@]H1[:PORT],H2,H3; rediss, rediss+sentinel and
// rediss+cluster are the same over TLS. A URL with a password, a
// query or a fragment is refused: the secret goes in password_file. The
// error never repeats the URL (it may hold a secret).
func ParseStore(s string) (StoreURL, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	var u StoreURL
	switch scheme {
	case StoreRedis, StoreRedisTLS, StoreSentinel, StoreSentinelTLS, StoreCluster, StoreClusterTLS:
		u.Scheme = scheme
	default:
		if !ok {
			return StoreURL{}, errors.New(storeForms)
		}
		return StoreURL{}, fmt.Errorf("unknown scheme %q: %s", scheme, storeForms)
	}
	if strings.ContainsAny(rest, "?#") {
		return StoreURL{}, fmt.Errorf("a query or fragment: %s", storeForms)
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		user := hosts[:at]
		hosts = hosts[at+1:]
		if strings.Contains(user, ":") {
			return StoreURL{}, errors.New("the URL holds a password: put it in password_file, never in the policy")
		}
		u.Username = user
	}
	port := "6379"
	if u.Sentinel() {
		port = "26379"
	}
	for _, h := range strings.Split(hosts, ",") {
		addr, err := storeAddr(h, port)
		if err != nil {
			return StoreURL{}, err
		}
		u.Addrs = append(u.Addrs, addr)
	}
	if len(u.Addrs) > 1 && !u.Sentinel() && !u.Cluster() {
		return StoreURL{}, fmt.Errorf("%s:// takes one host; for several use redis+sentinel:// or redis+cluster://", scheme)
	}
	parts := strings.Split(path, "/")
	if path == "" {
		parts = nil
	}
	switch {
	case u.Sentinel():
		if len(parts) == 0 || parts[0] == "" {
			return StoreURL{}, errors.New("redis+sentinel:// needs the master's name: redis+sentinel://H1,H2/MASTER")
		}
		u.Master, parts = parts[0], parts[1:]
	case u.Cluster():
		if len(parts) > 0 {
			return StoreURL{}, errors.New("redis+cluster:// takes no path: a Cluster has database 0 only")
		}
	}
	if len(parts) > 1 {
		return StoreURL{}, fmt.Errorf("a path of more than a database number: %s", storeForms)
	}
	if len(parts) == 1 {
		db, err := strconv.Atoi(parts[0])
		if err != nil || db < 0 || db > 1<<20 || parts[0] != strconv.Itoa(db) {
			return StoreURL{}, fmt.Errorf("database %q: want a number from 0", parts[0])
		}
		u.DB = db
	}
	return u, nil
}

// storeAddr is HOST:PORT of one host of a store URL, with port as the
// default.
func storeAddr(h, port string) (string, error) {
	if h == "" {
		return "", fmt.Errorf("a host is empty: %s", storeForms)
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

// redactStore is a store URL as a log may show it: with anything between
// :// and @ (a user and a password) replaced. Errors never show the URL.
func redactStore(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	hosts, path, hasPath := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		hosts = "REDACTED@" + hosts[at+1:]
	}
	if hasPath {
		hosts += "/" + path
	}
	return scheme + "://" + hosts
}

// TableMax is the max the policy's tier table is compiled for: Fleet.Max
// when fleet is on, else Max (docs/design.md §12: the tiers apply to
// fleet.max as to a local max).
func (p Policy) TableMax() uint64 {
	if p.Fleet != nil {
		return p.Fleet.Max
	}
	return p.Max
}

// FleetFallbackPolicy returns the policy a member applies in fallback
// (docs/design.md §12), with fleet off: for FallbackShare, max =
// Fleet.Max ÷ members, members the count the store last returned (this
// member included; the quotient at least 1); for FallbackLocal, and for
// a share when no count was ever seen (members ≤ 0: a store unreachable
// since start), the policy's own max. With max: auto a share is clamped
// into the auto bounds (Auto is kept, and the agent's auto controller
// moves Max from there). Without a fleet it returns p unchanged. The
// agent writes others 0 (bpf.Limiter.SetFleetOthers) with it.
func (p Policy) FleetFallbackPolicy(members int) Policy {
	if p.Fleet == nil {
		return p
	}
	q := p.Local()
	if p.Fleet.Fallback == FallbackShare && members > 0 {
		q.Max = max(p.Fleet.Max/uint64(members), 1)
		if q.Auto != nil {
			q.Max = min(max(q.Max, q.Auto.Floor), q.Auto.Ceiling)
		}
	}
	return q
}

// Local returns p with fleet off: the policy of this host alone, with its
// own max (with max: auto, the learnt one). Its table is the local bound
// of a member with max: auto (FleetOthersWithAuto).
func (p Policy) Local() Policy {
	q := p.Clone()
	q.Fleet = nil
	return q
}

// validate checks a fleet block built in Go (the parser checks each key as
// it reads it) and its consistency with the policy p.
func (f *Fleet) validate(p Policy) error {
	if f == nil {
		return nil
	}
	switch {
	case f.Name == "":
		return configErr("fleet.name", "", ErrMissingKey, "a fleet needs a name")
	case !fleetNameRE.MatchString(f.Name):
		return configErr("fleet.name", f.Name, ErrFleet, "want 1 to 64 of A-Z a-z 0-9 . _ -")
	case f.Store == "":
		return configErr("fleet.store", "", ErrMissingKey, "a fleet needs a store: %s", storeForms)
	}
	u, err := ParseStore(f.Store)
	if err != nil {
		return configErr("fleet.store", "", ErrFleet, "%v", err) // never repeated: it may hold a password
	}
	if err := checkPackets("fleet.max", f.Max, ErrMax); err != nil {
		return err
	}
	switch {
	case f.Report <= 0 || f.Report > MaxFleetTTL:
		return configErr("fleet.report", f.Report.String(), ErrFleet, "must be more than 0 and at most %s", MaxFleetTTL)
	case f.TTL <= 0 || f.TTL > MaxFleetTTL:
		return configErr("fleet.ttl", f.TTL.String(), ErrFleet, "must be more than 0 and at most %s", MaxFleetTTL)
	case f.Report >= f.TTL:
		return configErr("fleet.report", f.Report.String(), ErrFleet, "must be less than fleet.ttl (%s): a member must report within its ttl", f.TTL)
	case f.PasswordFile != "" && !filepath.IsAbs(f.PasswordFile):
		return configErr("fleet.password_file", f.PasswordFile, ErrFleet, "want an absolute path")
	case f.CAFile != "" && !filepath.IsAbs(f.CAFile):
		return configErr("fleet.ca_file", f.CAFile, ErrFleet, "want an absolute path")
	case f.CAFile != "" && !u.TLS():
		return configErr("fleet.ca_file", f.CAFile, ErrFleet, "a CA file is for a TLS store only (rediss://, rediss+sentinel://, rediss+cluster://)")
	case f.Fallback != FallbackShare && f.Fallback != FallbackLocal:
		return configErr("fleet.fallback", f.Fallback.String(), ErrFleet, "want share or local")
	case p.Shape != ShapeSmooth:
		return configErr("shape", p.Shape.String(), ErrFleet, "fleet needs shape: smooth (the fleet rule is the smooth shape's)")
	}
	return nil
}

// ReadPasswordFile reads the store's password from path, as the agent does
// at start and on reload: the file's content less one trailing line break.
// An empty file is an error. The error names the path, never the content.
func ReadPasswordFile(path string, read func(string) ([]byte, error)) (string, error) {
	b, err := read(path)
	if err != nil {
		return "", &ConfigError{Key: "fleet.password_file", Value: path, Err: fmt.Errorf("%w: %v", ErrFleet, err)}
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", &ConfigError{Key: "fleet.password_file", Value: path, Err: fmt.Errorf("%w: the file is empty", ErrFleet)}
	}
	return s, nil
}

// String returns the block on one line for logs, such as
// "name=syslog-eu store=redis://10.0.0.5:6379/0 max=200000 report=100ms
// ttl=3s fallback=share".
func (f Fleet) String() string {
	return fmt.Sprintf("name=%s store=%s max=%d report=%s ttl=%s fallback=%s",
		f.Name, redactStore(f.Store), f.Max, f.Report, f.TTL, f.Fallback)
}
