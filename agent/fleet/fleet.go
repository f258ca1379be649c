// Package fleet is the fleet controller of docs/design.md §12: it shares one
// budget, fleet.max per window, across the members of a fleet of
// collectors through a Redis or Valkey store (standalone, Sentinel or
// Cluster; TLS; ACL users).
//
// Every report interval the controller reads this member's estimates R̂_in
// and R̂_tot from the program (Limiter.FleetEstimate), publishes them and
// reads the others' sums in one round trip (one server-side script), and
// hands the sums to the program (Limiter.SetFleetOthers), which judges
// in-budget packets on R̂_in + the others' in-budget sum and over-budget
// ones on the share of P(R̂_tot + their total) − P(R̂_in + their in). Between
// reports it polls the program every report/10 and reports at once when
// its R̂ more than doubled, and with each answer it hands the program its
// own R̂ at the report and the member count, by which the program scales
// the sums during its own onset (docs/design.md §12, "The fleet's first
// second"; the Limiter's optional FleetPoll and SetFleetOwn). Limiting
// never waits for the store: a store that is down, slow or refuses the
// password leaves the last view in place for ttl, after which the
// controller enters fallback (Fallback.EnterFallback) until the store
// answers again.
//
// With a license (Config.License: the policy has fleet: and license:)
// the day's spend is the fleet's: each report adds the member's passed
// bytes (LicenseLedger.TakeSpend) to one key per license day, in the same
// script, on the day the store's clock is in, and hands the ledger the
// fleet's total (FleetSpent); in fallback the ledger is told Unreachable
// (license.go; docs/design.md §12, "One license for the fleet").
//
// A fleet's state is three keys with the hash tag {tierlimit:fleet:NAME}
// (redis.go), so one ACL limits a member to its fleet (docs/design.md §12,
// Trust); TestFleetACL runs members under this one:
//
//	ACL SETUSER member on >PASSWORD resetkeys ~{tierlimit:fleet:NAME}:* resetchannels -@all
//	  +hello +auth +ping +client|setname +evalsha +eval +time +get +set +del +pttl
//	  +pexpire +hget +hset +hdel +hlen +hgetall +zadd +zrem +zcard +zrangebyscore
//
// The package never imports the agent: the agent passes it a Limiter (the
// BPF side, *bpf.Limiter), a Fallback (its own policy switch) and, for a
// member with max: auto, a Config.Bound that folds the learnt max into the
// others' sum it writes. It needs
// no privilege of its own; the kernel requirements are the agent's.
package fleet

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
	"unicode"
)

// Config is the `fleet:` section of a policy (docs/design.md §12), already
// validated by tiers.
type Config struct {
	// Name is the fleet's name: members with the same name and store
	// share one budget.
	Name string
	// Member names this member in the store; empty means the host name.
	// Each start of a controller is an instance of its own (a random id),
	// with an entry of its own: two processes under one name are both
	// counted, and each says so (docs/design.md §12, Identity).
	Member string
	// InstanceFile, when set, is where this host keeps its instance id
	// across restarts: a controller that finds an earlier one there
	// replaces that instance's entry at its first report, instead of
	// counting it until its ttl. The agent keeps it beside its state file.
	InstanceFile string
	// Store is the store URL: redis://, rediss://, redis+sentinel://h1,h2/master,
	// redis+cluster://h1,h2,h3 (and rediss+sentinel://, rediss+cluster://).
	Store string
	// PasswordFile holds the store's password (less one trailing line
	// break, as storeurl.ReadPassword reads it), read at start and on
	// Reload; empty for a store without one.
	PasswordFile string
	// CAFile is the CA bundle for rediss:// stores; empty for the system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key (PEM)
	// that a TLS store with tls-auth-clients asks for; both or neither,
	// TLS only. Like PasswordFile and CAFile they are read again at every
	// new connection (dial.go), so that a rotated file applies without a
	// reload.
	CertFile, KeyFile string
	// ServerName, when set, is the name each TLS server's certificate is
	// checked against, in place of the host dialled: for stores that
	// announce IP addresses (a Sentinel's master, a Cluster's nodes) with
	// certificates that name DNS names only.
	ServerName string
	// SentinelPasswordFile holds the Sentinels' own password (their
	// requirepass), read as PasswordFile is; SentinelUser their ACL user.
	// Sentinel stores only; empty for Sentinels without one.
	SentinelPasswordFile, SentinelUser string
	// Resolver resolves the store's host names, at each new connection and
	// at least every 30 s (dial.go); nil is net.DefaultResolver. Not a
	// policy key: a seam for a program, or a test, that resolves names its
	// own way.
	Resolver *net.Resolver
	// Max is fleet.max, the whole fleet's budget per window. The controller
	// only reports it; the agent compiles the tiers for it.
	Max uint64
	// Report is how often the member reports, and each report's deadline.
	Report time.Duration
	// TTL is how long a member not heard from stays in the fleet (each
	// entry ages out on the ttl written with it), and how long a member
	// keeps its last view when the store does not answer.
	TTL time.Duration
	// Window is the policy's window and Digest the digest of its table
	// (tiers.Policy.FleetDigest): with Max and TTL, the settings every
	// member writes with its entry and the members compare
	// (docs/design.md §12, Agreement). Only reported.
	Window time.Duration
	Digest string
	// Fallback is what the agent applies once the store has not answered
	// for TTL: FallbackShare, FallbackLocal or FallbackLast. The controller passes it on
	// untouched (see Fallback).
	Fallback string
	// Bound, when set, is what the controller writes into the program in
	// place of the store's others' sums: Bound(own, others), own the
	// estimates this member reported and others the sums the store
	// returned. The agent sets it to an AutoBound's Fold, which holds a
	// member with max: auto to the pass probability of its learnt max on
	// its own R̂ (tiers.FleetOthersWithAuto; docs/design.md §12, "With
	// max: auto") from the tables the agent hands it, and is the
	// identity otherwise.
	// It is called from the report loop once per answered report and must
	// not block; each sum it returns below the store's is raised to it.
	// The fleet_others metric stays the store's total. Nil writes the sums
	// as they are.
	Bound func(own, others Sums) Sums
	// License, when set (the policy has fleet: and license:), makes the
	// day's spend the fleet's: each report adds the ledger's spend to the
	// day's key and hands the ledger the fleet's total (docs/design.md
	// §12, "One license for the fleet"). A reload may set, change or clear
	// it.
	License *License
}

// The values of Config.Fallback.
const (
	FallbackShare = "share" // fleet.max ÷ the members last seen
	FallbackLocal = "local" // the policy's own max
	FallbackLast  = "last"  // the last share, own R̂ ÷ R̂_fleet × fleet.max, for tiers.FleetLastHold × ttl; then share
)

// Sums is a pair of estimates, packets per window: of the in-budget
// packets and of all selected packets, in and over budget (In ≤ Total;
// without per-source budgets the two are equal).
type Sums struct {
	In, Total uint64
}

// Limiter is the controller's seam to the program: *bpf.Limiter satisfies
// it. All counts are packets per window.
type Limiter interface {
	// FleetEstimate returns this member's live R̂_in and R̂_tot.
	FleetEstimate() (in, total uint64, err error)
	// SetFleetOthers sets the others' sums that the program adds to
	// R̂_in and R̂_tot.
	SetFleetOthers(in, total uint64) error
}

// Fallback is the controller's seam to the agent's policy. The controller
// calls EnterFallback once the store has not answered for ttl, or at start
// when the store is out of reach, and LeaveFallback when it answers again;
// the two alternate, starting with EnterFallback. members is the member
// count the store last returned (this member included), or 0 when the
// store has not answered since start: with fallback "share" the agent
// applies fleet.max ÷ members (its local max when members is 0), with
// "local" its local max. The controller sets the others' sum to 0 after
// EnterFallback and to the store's sum after LeaveFallback.
type Fallback interface {
	EnterFallback(members int) error
	LeaveFallback() error
}

// Errors of Start and Reload. Each is wrapped with the detail.
var (
	// ErrAuth (Status only): the store refused the credentials (a wrong
	// password in password_file, an unknown ACL user, a client
	// certificate refused). Start never returns it: a member whose store
	// refuses it starts in fallback and keeps retrying (fleet_auth_failed).
	ErrAuth = errors.New("fleet store refused the credentials (password_file)")
	// ErrPasswordFile: password_file cannot be read or is empty.
	ErrPasswordFile = errors.New("fleet password_file")
	// ErrSentinelPasswordFile: sentinel_password_file cannot be read or
	// is empty, or is set for a store that is not a Sentinel's.
	ErrSentinelPasswordFile = errors.New("fleet sentinel_password_file")
	// ErrCertFile: cert_file or key_file cannot be read, do not make a
	// pair, only one is set, or they are set for a store without TLS.
	ErrCertFile = errors.New("fleet cert_file")
	// ErrCAFile: ca_file cannot be read, holds no certificate, or is set
	// for a store that is not rediss://.
	ErrCAFile = errors.New("fleet ca_file")
	// ErrStoreURL: the store URL is one storeurl.Parse refuses
	// (malformed, an unknown scheme, a password in it).
	ErrStoreURL = errors.New("fleet store")
	// ErrConfig: another key of Config is out of range; the message names it.
	ErrConfig = errors.New("fleet config")
	// ErrRestart (Reload only): the new Config names another fleet, member,
	// store, CA, server_name or TLS or Sentinel setting; the agent closes
	// this controller and starts a new one.
	ErrRestart = errors.New("fleet store or name changed: restart the controller")
)

// check validates what the controller itself relies on; tiers validates
// the section fully. It fills in Member.
func (c *Config) check() error {
	if c.Name == "" {
		return fmt.Errorf("%w: name is empty", ErrConfig)
	}
	if strings.ContainsAny(c.Name, "{}") || len(c.Name) > 200 {
		return fmt.Errorf("%w: name %q: at most 200 characters, no braces", ErrConfig, c.Name)
	}
	if c.Report <= 0 {
		return fmt.Errorf("%w: report %v must be positive", ErrConfig, c.Report)
	}
	if c.TTL <= c.Report {
		return fmt.Errorf("%w: ttl %v must be longer than report %v", ErrConfig, c.TTL, c.Report)
	}
	switch c.Fallback {
	case FallbackShare, FallbackLocal, FallbackLast:
	case "":
		c.Fallback = FallbackShare
	default:
		return fmt.Errorf("%w: fallback %q (share, local, last)", ErrConfig, c.Fallback)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return fmt.Errorf("%w: cert_file %q and key_file %q: set both or neither", ErrCertFile, c.CertFile, c.KeyFile)
	}
	if c.Member == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("%w: member name from the host name: %v", ErrConfig, err)
		}
		c.Member = h
	}
	if strings.IndexFunc(c.Member, unicode.IsControl) >= 0 || len(c.Member) > 200 {
		return fmt.Errorf("%w: member name %q: at most 200 characters, no control characters", ErrConfig, c.Member)
	}
	return nil
}
