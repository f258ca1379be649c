package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxBackoff caps the wait between two attempts to reach a store that
// failed (docs/design.md §12, "Connections"): with the jitter, a member
// tries at most about twice a second while its store, or a Sentinel's
// master, is down.
const maxBackoff = time.Second

// backoff spaces the attempts to reach a store after a failure that was
// not the store's answer (a connection reset or closed, a TLS handshake, a
// refusal of the credentials, an operation past its deadline, a dial that
// timed out): the n-th failure in a row waits a random time in [d/2, d],
// d = min(maxBackoff, report × 2^(n-1)). A refusal of the credentials is
// tried again at once when a file the connection reads changed since
// before the refused attempt (fingerprint, wait): a rotation rejoins at
// the next report. A dial refused outright is left to go-redis, which
// after two stops dialling that pool and probes it once a second
// (internal/pool's dial breaker): a second wait on top of that one would
// only delay the rejoin.
type backoff struct {
	mu       sync.Mutex
	failures int
	next     time.Time
	last     error  // the failure that set next
	files    []byte // fingerprint at a refusal of the credentials
}

// backingOffError is what a report returns while its store backs off: the
// last failure, which isAuth and isTimeout see through.
type backingOffError struct {
	until time.Time
	last  error
}

func (e backingOffError) Error() string {
	return fmt.Sprintf("backing off until %s after: %v", e.until.Format("15:04:05.000"), e.last)
}
func (e backingOffError) Unwrap() error { return e.last }

// wait returns nil when an attempt may go out now, else a backingOffError.
// In a run of failures it also returns, for an attempt that goes out, the
// fingerprint of the files as they are before it (files), which done
// records should the attempt be refused: a file rotated while the refused
// attempt was on its way is then a change the next call sees, and is tried
// at once. Taken after the refusal, the fingerprint was the rotated files'
// and left the member refused for the whole backoff (TestBackoffRotation).
// The files are read only when an attempt goes out in a run of failures,
// or to look for a rotation after a refusal.
func (b *backoff) wait(now time.Time, files func() []byte) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures == 0 {
		return nil, nil
	}
	if !now.Before(b.next) {
		return files(), nil
	}
	if b.files != nil {
		if fp := files(); !bytes.Equal(fp, b.files) {
			return fp, nil // rotated: try the new credentials now
		}
	}
	return nil, backingOffError{until: b.next, last: b.last}
}

// done records the outcome of an attempt made at now with the report
// interval report in force; before is what wait returned for it (nil out
// of a run of failures: the files are read now, after a first refusal).
func (b *backoff) done(now time.Time, report time.Duration, err error, before []byte, files func() []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !countsAsFailure(err) {
		b.failures, b.last, b.files = 0, nil, nil
		return
	}
	b.failures++
	d := maxBackoff
	if b.failures < 31 {
		d = min(maxBackoff, report<<(b.failures-1))
	}
	d = d/2 + rand.N(d/2+1)
	b.next, b.last = now.Add(d), err
	b.files = nil
	if isAuth(err) {
		b.files = before
		if b.files == nil {
			b.files = files()
		}
	}
}

// countsAsFailure reports whether err is a failure to reach the store: not
// nil, not the store's answer (an error reply other than a refusal of the
// credentials).
func countsAsFailure(err error) bool {
	if err == nil {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) && !isAuth(err) {
		return false
	}
	var be backingOffError
	return !errors.As(err, &be) && !refusedDial(err)
}

// refusedDial reports whether err is a dial that failed at once (a
// connection refused, no route): not one that timed out.
func refusedDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && !op.Timeout()
}
