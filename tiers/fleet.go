package tiers

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// ErrFleet: a fleet setting (docs/design.md §12) that is out of range or
// inconsistent: a name that is not 1-64 of [A-Za-z0-9._-], a store URL
// that is not one of the four forms (or holds a password), a report or
// ttl that is not positive or a report not under ttl, a relative
// password_file, ca_file, cert_file, key_file or sentinel_password_file, a
// ca_file, cert_file, key_file or server_name for a store without TLS, a
// cert_file without key_file or the reverse, a server_name that is not a
// DNS name, a sentinel_password_file or sentinel_user for a store that is
// not a Sentinel's, a fallback other than share, local or last, or fleet
// with the ordinal shape.
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
	// FallbackLast keeps the member's last share, own R̂ ÷ R̂_fleet ×
	// fleet.max at the last report answered, for FleetLastHold ttls,
	// then judges as FallbackShare (docs/design.md §12, Partitions).
	FallbackLast
)

// String returns "share" or "local".
func (f FleetFallback) String() string {
	switch f {
	case FallbackShare:
		return "share"
	case FallbackLocal:
		return "local"
	case FallbackLast:
		return "last"
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
	// Store is the store's URL as written (storeurl.Parse reads it):
	// redis://, rediss://, redis+sentinel://h1,h2/master or
	// redis+cluster://h1,h2,h3, and rediss+sentinel:// and rediss+cluster://
	// over TLS.
	Store string
	// PasswordFile is the absolute path of the file that holds the store's
	// password, or "". The agent reads it at start and on reload
	// (storeurl.ReadPassword); tiers never opens it.
	PasswordFile string
	// CAFile is the absolute path of the CA bundle that verifies a TLS
	// store (rediss...), or "" for the system's roots.
	CAFile string
	// CertFile and KeyFile are the absolute paths of the client
	// certificate and its key (PEM) for a TLS store that asks for one
	// (tls-auth-clients), both or neither. The agent reads them at each
	// new connection.
	CertFile, KeyFile string
	// ServerName, when set, is the DNS name every TLS server's
	// certificate is checked against instead of the address dialled
	// (stores that announce IP addresses: a Sentinel's master, a
	// Cluster's nodes). TLS stores only.
	ServerName string
	// SentinelPasswordFile is the absolute path of the file that holds
	// the Sentinels' own password (their requirepass), read as
	// PasswordFile; SentinelUser their ACL user. Sentinel stores only.
	SentinelPasswordFile, SentinelUser string
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

var (
	fleetNameRE    = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	serverNameRE   = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
	sentinelUserRE = regexp.MustCompile(`^[^\s\x00-\x1f\x7f]{1,128}$`)
)

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
//
// FallbackLast without a last share (FleetFallbackLast's) is
// FallbackShare.
func (p Policy) FleetFallbackPolicy(members int) Policy {
	return p.FleetFallbackLast(members, 0)
}

// FleetFallbackLast is FleetFallbackPolicy with, for FallbackLast, the
// member's last share: last, packets per window (FleetLastShare), 0 once
// it has decayed or when none was seen, which is FallbackShare's max.
func (p Policy) FleetFallbackLast(members int, last uint64) Policy {
	if p.Fleet == nil {
		return p
	}
	q := p.Local()
	share := p.Fleet.Fallback == FallbackShare || p.Fleet.Fallback == FallbackLast
	if p.Fleet.Fallback == FallbackLast && last > 0 {
		q.Max = min(last, p.Fleet.Max)
		if q.Auto != nil {
			q.Max = min(max(q.Max, q.Auto.Floor), q.Auto.Ceiling)
		}
	} else if share && members > 0 {
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
		return configErr("fleet.store", "", ErrMissingKey, "a fleet needs a store: %s", storeurl.Forms)
	}
	u, err := storeurl.Parse(f.Store)
	if err != nil {
		return configErr("fleet.store", "", ErrFleet, "%v", err) // never repeated: it may hold a password
	}
	if err := checkPackets("fleet.max", f.Max, ErrMax, p.Count); err != nil {
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
	}
	return f.validateConn(u, p)
}

// validateConn checks the keys of the store's connection, after the rest
// (validate).
func (f *Fleet) validateConn(u storeurl.URL, p Policy) error {
	for _, k := range []struct{ key, path string }{
		{"fleet.cert_file", f.CertFile}, {"fleet.key_file", f.KeyFile}, {"fleet.sentinel_password_file", f.SentinelPasswordFile},
	} {
		if k.path != "" && !filepath.IsAbs(k.path) {
			return configErr(k.key, k.path, ErrFleet, "want an absolute path")
		}
	}
	const tlsOnly = "for a TLS store only (rediss://, rediss+sentinel://, rediss+cluster://)"
	const sentinelOnly = "for a Sentinel store only (redis+sentinel://, rediss+sentinel://)"
	switch {
	case f.CertFile != "" && f.KeyFile == "":
		return configErr("fleet.cert_file", f.CertFile, ErrFleet, "needs fleet.key_file, the certificate's key")
	case f.KeyFile != "" && f.CertFile == "":
		return configErr("fleet.key_file", f.KeyFile, ErrFleet, "needs fleet.cert_file, the certificate it is the key of")
	case f.CertFile != "" && !u.TLS():
		return configErr("fleet.cert_file", f.CertFile, ErrFleet, "a client certificate is "+tlsOnly)
	case f.ServerName != "" && !u.TLS():
		return configErr("fleet.server_name", f.ServerName, ErrFleet, "a server name is "+tlsOnly)
	case f.ServerName != "" && !serverNameRE.MatchString(f.ServerName):
		return configErr("fleet.server_name", f.ServerName, ErrFleet, "want a DNS name such as redis.example.com (letters, digits, - and .)")
	case f.SentinelPasswordFile != "" && !u.Sentinel():
		return configErr("fleet.sentinel_password_file", f.SentinelPasswordFile, ErrFleet, "a Sentinel password is "+sentinelOnly)
	case f.SentinelUser != "" && !u.Sentinel():
		return configErr("fleet.sentinel_user", f.SentinelUser, ErrFleet, "a Sentinel user is "+sentinelOnly)
	case f.SentinelUser != "" && !sentinelUserRE.MatchString(f.SentinelUser):
		return configErr("fleet.sentinel_user", f.SentinelUser, ErrFleet, "want an ACL user name: 1 to 128 characters, no space, no control character")
	case f.Fallback != FallbackShare && f.Fallback != FallbackLocal && f.Fallback != FallbackLast:
		return configErr("fleet.fallback", f.Fallback.String(), ErrFleet, "want share, local or last")
	case p.Shape != ShapeSmooth:
		return configErr("shape", p.Shape.String(), ErrFleet, "fleet needs shape: smooth (the fleet rule is the smooth shape's)")
	}
	return nil
}

// String returns the block on one line for logs, such as
// "name=syslog-eu store=redis://10.0.0.5:6379 max=200000 report=100ms
// ttl=3s fallback=share".
func (f Fleet) String() string {
	return fmt.Sprintf("name=%s store=%s max=%d report=%s ttl=%s fallback=%s",
		f.Name, storeurl.Redact(f.Store), f.Max, f.Report, f.TTL, f.Fallback)
}
