package fleet

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// Controller is one member's fleet controller. Start it with Start; it
// reports every Config.Report until Close.
type Controller struct {
	log   *slog.Logger
	lim   Limiter
	fb    Fallback
	store string // the redacted store URL, for logs
	st    store

	inst  string // this start's instance id (newInstance)
	cfg   atomic.Pointer[Config]
	creds atomic.Pointer[[2]string] // ACL user, password
	m     metrics
	cm    connMetrics
	fl    inflight
	lic   licenseState // the license's adds (license.go), the loop's

	// Loop state: the loop goroutine's alone once Start has returned.
	lastOK     time.Time // when the store last answered
	members    int       // the member count it last returned; 0 before any
	lastEst    Sums      // the estimates last read from the program
	lastRep    Sums      // the estimates of the last report answered, as reported
	ownSet     Sums      // what the program was last given as its own R̂ at the report (SetFleetOwn)
	again      bool      // a report at a poll was answered since the last regular report
	inFallback bool
	estFailed  bool // a FleetEstimate error was logged and not yet cleared
	setFailed  bool // a SetFleetOthers error was logged and not yet cleared
	authFailed bool // a refusal of the credentials was logged since the last answer
	// What the agent (a Viewer) was last told (view.go), and when the
	// member last entered fallback.
	told          bool
	toldMembers   int
	toldLast      uint64
	fallbackSince time.Time

	// Identity and agreement (identity.go), the loop's too.
	wrote      *Sums  // the estimates of the last answered report; nil before one
	replaces   string // the earlier instance on this host, until a report is answered
	conflicted bool   // another instance under this name was logged and not yet cleared
	differed   bool   // this member's settings differing was logged and not yet cleared

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Start checks cfg, reads password_file, connects to the store and makes
// the first report, waiting for it at most cfg.TTL; then it reports every
// cfg.Report in the background until Close.
//
// A store out of reach at start is no error: the controller logs a
// warning, enters fallback (fb.EnterFallback(0)) and joins when the store
// answers. Nor is a store that refuses the credentials: the controller
// logs an ERROR, sets fleet_auth_failed, enters fallback and keeps trying,
// reading the files again at each new connection (a rotation). Start
// returns an error, and starts nothing, when cfg is out of range
// (ErrConfig), the store URL is bad (ErrStoreURL), or password_file,
// sentinel_password_file, ca_file, cert_file or key_file cannot be read or
// do not fit the store (ErrPasswordFile, ErrSentinelPasswordFile,
// ErrCAFile, ErrCertFile).
func Start(cfg Config, lim Limiter, fb Fallback, log *slog.Logger) (*Controller, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	su, err := parseStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		log:   log.With("fleet", cfg.Name, "member", cfg.Member),
		lim:   lim,
		fb:    fb,
		store: storeurl.Redact(cfg.Store),
		inst:  newInstance(),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	c.m.viewAt.Store(time.Now().UnixNano())
	c.log = c.log.With("instance", c.inst)
	if err := c.loadCreds(cfg, su.Username); err != nil {
		return nil, err
	}
	prev, err := swapInstance(cfg.InstanceFile, c.inst)
	if err != nil {
		c.log.Warn("fleet: cannot keep the instance id: after a restart the earlier instance ages out in ttl instead of at once", "err", err)
	}
	c.replaces = prev
	c.cfg.Store(&cfg)
	c.st, err = dial(&connOptions{su: su, cfg: cfg, dials: &c.cm.dials, log: c.log, creds: c.credentials,
		report: func() time.Duration { return c.cfg.Load().Report },
		ttl:    func() time.Duration { return c.cfg.Load().TTL }})
	if err != nil {
		return nil, err
	}
	est := c.estimate()
	v, sent, err := c.reportWithin(&cfg, est, cfg.TTL)
	if err != nil {
		c.m.reports(resultOf(err, false)).Add(1)
		if isAuth(err) {
			c.refused(err, "starting in fallback")
		} else {
			c.log.Warn("fleet store out of reach at start: starting in fallback", "store", c.store, "fallback", cfg.Fallback, "err", err)
		}
		c.enterFallback(0)
	} else {
		c.m.reports(resultOK).Add(1)
		c.joined(time.Now(), sent, v, false)
		c.log.Info("joined the fleet", "store", c.store, "members", v.members, "others", v.others.Total, "others_in", v.others.In)
	}
	go c.run()
	return c, nil
}

// loadCreds reads password_file (when set) into c.creds.
func (c *Controller) loadCreds(cfg Config, user string) error {
	pw := ""
	if cfg.PasswordFile != "" {
		var err error
		if pw, err = readPassword(cfg.PasswordFile); err != nil {
			return err
		}
	}
	c.creds.Store(&[2]string{user, pw})
	return nil
}

// credentials is go-redis's CredentialsProviderContext: password_file is
// read again at each new connection, so that a password rotated in the
// file (a Kubernetes Secret's volume, an atomic swap) applies at the next
// one without a reload; a file that cannot be read then leaves the last
// password read in use.
func (c *Controller) credentials(context.Context) (string, string, error) {
	if f := c.cfg.Load().PasswordFile; f != "" {
		if pw, err := readPassword(f); err == nil {
			c.creds.Store(&[2]string{c.creds.Load()[0], pw})
		} else {
			c.log.Debug("fleet password_file unreadable at a new connection: the last password read is used", "err", err)
		}
	}
	cr := c.creds.Load()
	return cr[0], cr[1], nil
}

// refused says once, as an ERROR, that the store refuses the credentials,
// and sets fleet_auth_failed until the store answers.
func (c *Controller) refused(err error, doing string) {
	c.cm.authFailed.Store(1)
	if c.authFailed {
		return
	}
	c.authFailed = true
	attrs := []any{"store", c.store, "err", err}
	var host x509.HostnameError
	if errors.As(err, &host) && host.Certificate != nil {
		// A store announced by IP with a certificate for names: say which.
		attrs = append(attrs, "certificate_names", strings.Join(host.Certificate.DNSNames, ","), "hint", "set fleet.server_name to one of them")
	}
	c.log.Error("fleet store refuses the credentials: "+doing+"; retrying, reading password_file, cert_file and key_file again at each attempt", attrs...)
}

// Reload applies a reloaded policy's fleet section: it reads password_file
// again (new connections use the new password) and takes the new report,
// ttl, max and fallback. A section that names another fleet, member, store
// or CA file returns ErrRestart and changes nothing; the agent then closes
// this controller and starts another. Other errors are Start's.
func (c *Controller) Reload(cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	old := c.cfg.Load()
	if cfg.Name != old.Name || cfg.Member != old.Member || cfg.Store != old.Store || cfg.CAFile != old.CAFile ||
		cfg.CertFile != old.CertFile || cfg.KeyFile != old.KeyFile || cfg.ServerName != old.ServerName ||
		cfg.SentinelPasswordFile != old.SentinelPasswordFile || cfg.SentinelUser != old.SentinelUser {
		return ErrRestart
	}
	su, err := parseStore(cfg.Store)
	if err != nil {
		return err
	}
	if err := c.loadCreds(cfg, su.Username); err != nil {
		return err
	}
	c.cfg.Store(&cfg)
	return nil
}

// Close stops the report loop and leaves the fleet: the member's entry is
// deleted from the store (one round trip, with a deadline of report), so
// that the others stop counting it at their next report instead of after
// ttl. It returns the error of that round trip, if any; the member then
// ages out within ttl. Close is safe to call more than once.
func (c *Controller) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.stop)
		<-c.done
		c.abandon()
		cfg := c.cfg.Load()
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Report)
		defer cancel()
		if e := c.st.leave(ctx, cfg.Name, c.entry(cfg, Sums{})); e != nil {
			err = fmt.Errorf("leave fleet %s: %w", cfg.Name, e)
		}
		// The member left: its view has expired, so that a pinned
		// program judges alone on the fallback from now on, with no
		// agent (docs/design.md §12, "A view that expires").
		c.writeView(Sums{}, 0)
		c.st.close()
	})
	return err
}

// run reports every report interval until Close, and between reports
// polls the program's estimate every report/10 (at least 1 ms): it
// reports at once when its R̂_tot more than doubled since the last report,
// or, after such a report, rose by a quarter (tiers.FleetReportNow;
// docs/design.md §12, "The fleet's first second"). A poll is one
// FleetEstimate, a few map reads.
func (c *Controller) run() {
	defer close(c.done)
	every := c.cfg.Load().Report
	t := time.NewTicker(pollEvery(every))
	defer t.Stop()
	next := time.Now().Add(every)
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if now := time.Now(); !now.Before(next) {
			c.tick(false)
			c.again = false
			if next = next.Add(every); next.Before(now) {
				next = now.Add(every)
			}
		} else if !c.fl.pending && c.pollNow() {
			// An early report only when none is in flight (inflight.go).
			c.tick(true)
		}
		if r := c.cfg.Load().Report; r != every {
			every = r
			t.Reset(pollEvery(every))
			next = time.Now().Add(every)
		}
	}
}

// pollEvery is the poll interval of report: report/10, at least 1 ms.
func pollEvery(report time.Duration) time.Duration {
	return max(report/10, time.Millisecond)
}

// poller is a Limiter that can be polled between reports
// (*bpf.Limiter.FleetPoll): its R̂_tot, as FleetEstimate reads it. A
// Limiter without it is not polled, and reports at its regular pace only.
type poller interface {
	FleetPoll() (total uint64, err error)
}

// pollNow reads the program's R̂_tot and says whether to report at once
// (tiers.FleetReportNow); never in fallback, nor when the estimate cannot
// be read.
func (c *Controller) pollNow() bool {
	p, ok := c.lim.(poller)
	if !ok || c.inFallback {
		return false
	}
	total, err := p.FleetPoll()
	return err == nil && tiers.FleetReportNow(total, c.lastRep.Total, c.again)
}

// tick is one report: read R̂, one round trip bounded by report, hand the
// others' sum to the program. It never waits longer than report. early
// says it is a poll's (run).
func (c *Controller) tick(early bool) {
	cfg := c.cfg.Load()
	est := c.estimate()
	start := time.Now()
	v, sent, err := c.reportWithin(cfg, est, cfg.Report)
	now := time.Now()
	slow := now.Sub(start) > cfg.Report
	c.m.reports(resultOf(err, slow)).Add(1)
	if err == nil {
		c.joined(now, sent, v, early)
		return
	}
	c.m.storeUp.Store(0)
	c.m.offered.Store(est.Total + c.m.others.Load())
	c.log.Debug("fleet report failed", "err", err)
	if isAuth(err) {
		// A password changed on the store but not (yet) in password_file:
		// said once, not at every report.
		c.refused(err, "check password_file")
	}
	if !c.inFallback && now.Sub(c.lastOK) > cfg.TTL {
		c.log.Warn("fleet store not answering for ttl: in fallback", "store", c.store, "ttl", cfg.TTL,
			"fallback", cfg.Fallback, "members_last_seen", c.members, "err", err)
		c.enterFallback(c.members)
	}
	c.decay(now, cfg)
}

// joined applies an answer of the store: rejoin if in fallback, then hand
// the program the others' sums (through Config.Bound when set) with what
// they answer (setOwn). early says the report was a poll's.
func (c *Controller) joined(now time.Time, est Sums, v view, early bool) {
	expiry := monoNow() + uint64(c.cfg.Load().TTL)
	c.lastOK = now
	c.m.viewAt.Store(now.UnixNano())
	c.authFailed = false
	c.cm.authFailed.Store(0)
	c.replaces = ""
	c.wrote = &est
	c.members = v.members
	c.judge(v)
	others := v.others
	if b := c.cfg.Load().Bound; b != nil {
		o := b(est, others)
		others = Sums{In: max(o.In, others.In), Total: max(o.Total, others.Total)}
	}
	// What the sums answer (the report's own estimates, as sent: est),
	// then the view: a packet between the two scales an old sum from the
	// new report, for the microseconds between them.
	rep := est
	own := rep
	if early {
		// At a poll the member keeps the base of its rise, its own R̂ at
		// its last regular report, until its next one: the others'
		// sums still stand for the traffic before the flood, and its
		// rise is their best guess until then (docs/design.md §12;
		// model.FleetModel.Advance). Idle at its last report, it keeps
		// the equal-share prior through its first report at a poll.
		own = c.ownSet
		if !c.again && c.ownSet.Total < tiers.SmoothOnsetMin {
			own = Sums{}
		}
	}
	c.again = c.again || early
	c.lastRep = rep
	c.setOwn(own, v.members)
	// The view first: leaving fallback with the fallback's view (0)
	// would judge the fleet's table alone until it came.
	c.writeView(others, expiry)
	if c.inFallback {
		if err := c.fb.LeaveFallback(); err != nil {
			c.log.Error("leave fleet fallback", "err", err)
		}
		c.inFallback = false
		c.m.fallback.Store(0)
		c.log.Info("fleet store answers again: rejoined the fleet", "store", c.store, "members", v.members)
	}
	c.viewed(v.members, lastShare(c.cfg.Load(), est, v.others))
	c.m.storeUp.Store(1)
	c.m.members.Store(int64(v.members))
	c.m.others.Store(v.others.Total)
	c.m.offered.Store(est.Total + v.others.Total)
}

// enterFallback switches the agent to its fallback and the program to
// judging on its own estimate.
func (c *Controller) enterFallback(members int) {
	c.fallbackSince = time.Now()
	if err := c.fb.EnterFallback(members); err != nil {
		c.log.Error("enter fleet fallback", "err", err)
	}
	c.inFallback = true
	// In fallback the own R̂, its inverse and the member count scale
	// nothing (the program ignores them past the view's expiry too).
	c.setOwn(Sums{}, 0)
	c.writeView(Sums{}, c.fallbackExpiry(monoNow(), c.cfg.Load()))
	c.m.fallback.Store(1)
	c.m.others.Store(0)
	c.m.offered.Store(c.lastEst.Total)
	c.licenseUnreachable()
}

// estimate reads this member's R̂_in and R̂_tot; on an error it logs once
// and reports the last values read, so that the member stays in the fleet.
func (c *Controller) estimate() Sums {
	in, total, err := c.lim.FleetEstimate()
	est := Sums{In: min(in, total), Total: total}
	if err != nil {
		if !c.estFailed {
			c.log.Error("read the fleet estimate from the program: reporting the last one", "err", err)
			c.estFailed = true
		}
		return c.lastEst
	}
	c.estFailed = false
	c.lastEst = est
	return est
}

// ownSetter is a Limiter that takes what the others' sums answer
// (*bpf.Limiter.SetFleetOwn): this member's R̂ at the report and the
// member count, for the fleet's first second (docs/design.md §12).
type ownSetter interface {
	SetFleetOwn(in, total, members uint64) error
}

// setOwn hands the program own, this member's estimates at the report
// the next sums answer, and the member count, when the Limiter takes
// them; before writeView, so that a packet between the two scales an old
// sum from the new report. A failure is logged once, as setOthers's.
func (c *Controller) setOwn(own Sums, members int) {
	c.ownSet = own
	s, ok := c.lim.(ownSetter)
	if !ok {
		return
	}
	if err := s.SetFleetOwn(own.In, own.Total, uint64(max(members, 0))); err != nil {
		if !c.setFailed {
			c.log.Error("write this member's report to the program", "err", err)
			c.setFailed = true
		}
	}
}

// resultOf classifies a report: slow when it hit its deadline or took
// longer than report, error on any other failure.
func resultOf(err error, slow bool) string {
	switch {
	case err == nil && !slow:
		return resultOK
	case err == nil || isTimeout(err):
		return resultSlow
	default:
		return resultError
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}
