package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// store is the fleet's shared state as the controller and Status reach it
// (docs/design.md §12): each call is one round trip, bounded by ctx.
// redis.go holds the one backend, Redis or Valkey; a second backend is
// one file with a type that satisfies store, and a case in dial.
//
// A call that hits ctx's deadline returns an error that isTimeout
// recognises (context.DeadlineExceeded, os.ErrDeadlineExceeded or a
// net.Error timeout); a store that refuses the credentials or the ACL
// user's rights, or a TLS certificate either way, returns a refusedError
// (isAuth). A backend reconnects on its own after a failed connection,
// backing off (backoff.go): while it backs off, report returns a
// backingOffError that wraps the last failure.
type store interface {
	// report publishes one instance's entry e (its estimates, packets per
	// window, its ttl and settings) in fleet name, drops the entries that
	// aged out on their own ttl and the earlier instance e replaces, and
	// returns the others' sums, the entry count (this one included) and
	// what the store saw of e's name and settings (view).
	report(ctx context.Context, name string, e entry) (view, error)
	// leave removes e's entry from fleet name.
	leave(ctx context.Context, name string, e entry) error
	// members lists fleet name's entries as the store holds them, in no
	// order, each with its age on the store's clock.
	members(ctx context.Context, name string) ([]Member, error)
	// license reads fleet name's license day among days that the
	// store's clock is in (license_status.go): its index, -1 for none.
	license(ctx context.Context, name string, days [3]span) (int, LicenseDay, error)
	// close releases the connections; it may wait for a hung one.
	close() error
}

// view is what one report returns.
type view struct {
	others  Sums
	members int
	// conflicts is the number of other live instances under this
	// member's name (two processes under one name: docs/design.md §12,
	// Identity); groups the number of distinct settings (window,
	// fleet.max, ttl, table digest) among the entries, and differs whether
	// this member's are not those of the most members (Agreement).
	conflicts, groups int
	differs           bool
	// lic is what the report's license add answered; nil without one.
	lic *licenseView
}

// dial opens the store o names. Its errors wrap ErrCAFile, ErrCertFile,
// ErrSentinelPasswordFile or ErrConfig (checkConn). Every scheme storeurl
// reads is Redis's (redis.go); dial.go holds the connections' lifecycle.
func dial(o *connOptions) (store, error) {
	s, err := dialRedis(o)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// refusedError is a store's error when it refuses the credentials or the
// ACL user's rights: the backend's error, unchanged.
type refusedError struct{ err error }

func (e refusedError) Error() string { return e.err.Error() }
func (e refusedError) Unwrap() error { return e.err }

// isAuth reports whether err is the store refusing the credentials or the
// ACL user's rights (a refusedError).
func isAuth(err error) bool {
	var r refusedError
	return errors.As(err, &r)
}

// parseStore reads a store URL with storeurl.Parse (docs/design.md §12:
// redis://, rediss://, redis+sentinel://h1,h2/master, redis+cluster://h1,h2,h3
// and the rediss+ forms; an ACL user but never a password). Errors wrap
// ErrStoreURL and never repeat the URL.
func parseStore(raw string) (storeurl.URL, error) {
	u, err := storeurl.Parse(raw)
	if err != nil {
		return u, fmt.Errorf("%w: %v", ErrStoreURL, err)
	}
	return u, nil
}

// readPassword reads password_file as the agent does (storeurl.ReadPassword:
// the content less one trailing line break). Errors wrap ErrPasswordFile,
// name the file and never quote the content.
func readPassword(file string) (string, error) {
	pw, err := storeurl.ReadPassword(file, os.ReadFile)
	if errors.Is(err, storeurl.ErrEmptyPassword) {
		err = fmt.Errorf("%s: %w", file, err)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrPasswordFile, err)
	}
	return pw, nil
}
