package fleet

import (
	"context"
	"fmt"
	"time"
)

// A report's deadline is the loop's, not the connection's (docs/design.md
// §12, "Connections"): the loop waits at most report for an answer, and
// a report that has not answered by then goes on, bounded by ttl, on its
// connection, while the loop limits on the last view. Its answer, when it
// comes, is the next tick's; no second report goes out while one is in
// flight. So a store farther away than report (a dial, a TLS handshake,
// HELLO and the script, each a round trip) is joined, and stays joined,
// instead of having each slow report tear its connection down and start
// the next one from a dial again.

// answer is a report's outcome.
type answer struct {
	v   view
	err error
	est Sums        // the estimates the answered report wrote
	lic *licenseAdd // the license's add it carried, nil for none
	at  time.Time   // when the store answered
}

// errNoAnswer is a report's result when its store has not answered within
// the wait: a timeout (isTimeout), counted slow.
var errNoAnswer = fmt.Errorf("the fleet store has not answered within report: %w", context.DeadlineExceeded)

// inflight is the report in flight, the loop's alone, and the worker that
// makes it: one goroutine for the controller's life, whose stack has grown
// to go-redis's depth once (a goroutine per report would grow one each
// time: most of the CPU of a report's handoff).
type inflight struct {
	reqs    chan request // capacity 1: the worker takes the report to make
	answers chan answer  // capacity 1: the report in flight answers here
	pending bool
	cancel  context.CancelFunc
	timer   *time.Timer
}

// request is one report for the worker.
type request struct {
	ctx    context.Context
	cancel context.CancelFunc
	cfg    *Config
	e      entry // built when the report is sent: its Prev is what the last answered report wrote
}

// worker makes the reports of reqs until it is closed.
func (c *Controller) worker(reqs <-chan request, answers chan<- answer) {
	for r := range reqs {
		v, err := c.st.report(r.ctx, r.cfg.Name, r.e)
		at := hostNow()
		r.cancel()
		if l := r.e.Lic; l != nil && l.ack != nil {
			// The ledger's spend is in the store when the script
			// answered with a day; else it comes again in the next add
			// (never lost; the script never counts it twice).
			l.ack(err == nil && v.lic != nil && v.lic.day >= 0)
		}
		answers <- answer{v, err, r.e.Est, r.e.Lic, at}
	}
}

// reportWithin sends est in a report unless one is in flight, and waits at
// most wait for the answer of the report in flight. It returns that answer,
// or errNoAnswer, with the estimates that report wrote (est, or an earlier
// report's when one was in flight). A report's own deadline is cfg.TTL.
// A report sent takes the license ledger's spend with it (takeSpend), and
// an answer hands the ledger the fleet's day total (spent).
func (c *Controller) reportWithin(cfg *Config, est Sums, wait time.Duration) (view, Sums, error) {
	f := &c.fl
	if f.reqs == nil {
		f.reqs, f.answers = make(chan request, 1), make(chan answer, 1)
		go c.worker(f.reqs, f.answers)
	}
	if f.timer == nil {
		f.timer = time.NewTimer(wait)
	} else {
		f.timer.Reset(wait)
	}
	if !f.pending {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.TTL)
		f.pending, f.cancel = true, cancel
		e := c.entry(cfg, est)
		e.Lic = c.takeSpend(cfg)
		f.reqs <- request{ctx, cancel, cfg, e}
	}
	select {
	case a := <-f.answers:
		f.pending = false
		f.timer.Stop()
		if a.err == nil {
			c.spent(cfg, a.lic, a.v, a.at)
		}
		return a.v, a.est, a.err
	case <-f.timer.C:
		return view{}, est, errNoAnswer
	}
}

// abandon cancels the report in flight, if any, without waiting for it (a
// hung store would hold a Close for ttl), and stops the worker once that
// report has answered into its buffer.
func (c *Controller) abandon() {
	f := &c.fl
	if f.pending {
		f.cancel()
		f.pending = false
	}
	if f.reqs != nil {
		close(f.reqs)
		f.reqs = nil
	}
}
