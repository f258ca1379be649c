package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

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
// user's rights returns a refusedError (isAuth). A backend reconnects on
// its own after a failed connection, by the next report at the latest.
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
}

// dial opens the store su names. timeout returns a new connection's dial
// and command timeout (the report in force; it is read again at each
// reconnection), creds the current user and password (password_file, read
// at start and on reload). Errors wrap ErrCAFile. Every scheme storeurl
// reads is Redis's (redis.go).
func dial(su storeurl.URL, caFile string, timeout func() time.Duration, creds func() (user, password string)) (store, error) {
	s, err := dialRedis(su, caFile, timeout, creds)
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
