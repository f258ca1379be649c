package agent

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/tiers"
)

// DefaultDebounce is how long a config file must stay quiet after a change
// before a Reloader reads it: editors and kubelet change a file in bursts.
const DefaultDebounce = 200 * time.Millisecond

// Reloadable is what a Reloader swaps policies into: *Agent.
type Reloadable interface {
	// Reload applies p, or keeps the old policy and returns why
	// not; it counts the attempt in either case. It gives up, keeping the
	// old policy, when ctx ends before p is active (the agent's SIGTERM
	// during a reload that writes tens of thousands of prefixes).
	Reload(ctx context.Context, p tiers.Policy) error
	// ReloadFailed counts a reload that failed before a policy existed.
	ReloadFailed()
	// ConfigWatch says how config file changes are noticed now.
	ConfigWatch(WatchMode)
}

var errClosed = errors.New("agent closed")

// Reload compiles p and swaps it in atomically (bpf.Limiter.Apply). On
// error the old policy keeps running, and the error is counted in
// config_reloads_total{result="error"}. The shed record takes the new
// record and events settings live (record.Change); a new record dir
// the agent cannot make or write refuses the reload (record.ErrDir). With an adaptive-max controller
// running (StartAutoMax), a p with the same auto bounds as the policy in
// force keeps the learnt max instead of p.Max. It gives up when ctx ends
// (SIGTERM) before the new policy is active, keeping the old one: a reload
// that writes tens of thousands of prefixes takes seconds
// (bpf.Limiter.Apply).
func (a *Agent) Reload(ctx context.Context, p tiers.Policy) error {
	err := a.reload(ctx, p)
	if err != nil {
		a.reloadErr.Add(1)
		return err
	}
	a.reloadOK.Add(1)
	return nil
}

// ReloadFailed counts a reload that failed before a policy existed (the
// config file did not parse).
func (a *Agent) ReloadFailed() { a.reloadErr.Add(1) }

func (a *Agent) reload(ctx context.Context, p tiers.Policy) error {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if a.closed.Load() {
		return errClosed
	}
	// A reload is a new given policy: on error the old one stays in
	// force, and Reload counts it.
	return a.apply(ctx, p, &newPolicy{a: a})
}

// apply is the one path from a policy to the settings map: New, Reload,
// the local addresses' follower, the fleet's fallback and the adaptive
// max all take it, with a.applyMu held. given is the policy as given:
// New's or a reload's, or the policy in force again (a.given) once a
// follower changed what it follows. In turn apply
//   - resolves the policy compiled for given (tiers.Effective) in the
//     state the rooms know: the adaptive max's learnt max, the fleet's
//     fallback, the host's destinations;
//   - compiles it, which validates it;
//   - has the rooms prepare for it (r: a new policy's signal and shed
//     record are opened here), refusing it with nothing changed when one
//     cannot;
//   - writes it (bpf.Limiter.Apply), the rooms' preparation undone on
//     error;
//   - records given as the policy in force, and hands the rooms their
//     part (r.commit).
func (a *Agent) apply(ctx context.Context, given tiers.Policy, r rooms) error {
	st := tiers.State{LearntMax: a.auto.Load().Learnt(given), Fallback: a.fleet.in, Members: a.fleet.members,
		LastShare: a.fleet.last, Local: a.local, LicenseMax: a.lic.Load().Max(given)}
	p, fit := tiers.Effective(given, st)
	tab, err := tiers.Compile(p, a.lim.Tick())
	if err != nil {
		return err
	}
	if err := r.prepare(p); err != nil {
		return err
	}
	if err := a.lim.Apply(ctx, tab); err != nil {
		r.abort()
		return err
	}
	a.given = given
	a.fleet.written(a.lim, given, st)
	a.follow.count(fit, a.log)
	r.commit(given, p, st)
	return nil
}

// rooms is the rooms' part of one apply (applyMu held): prepare opens
// what p, the policy compiled, needs before it is written, and abort
// closes it again when it is not; commit hands the rooms given, p and
// st, the state p was resolved in, once p is written.
type rooms interface {
	prepare(p tiers.Policy) error
	abort()
	commit(given, p tiers.Policy, st tiers.State)
}

// newPolicy is the rooms' part of applying a new given policy (New, a
// reload): before the write the adaptive max opens the signal of a new
// auto.netns and the shed record what its new settings need, each
// refusing the policy when it cannot; after it the adaptive max (keeping
// its learnt max for the same auto bounds), the fleet controller and the
// shed record take the new policy.
type newPolicy struct {
	a   *Agent
	src automax.DropSource
	rc  *record.Change
}

func (r *newPolicy) prepare(p tiers.Policy) (err error) {
	a := r.a
	if r.src, err = a.auto.Load().SourceFor(p, a.at.NS()); err != nil { // a new auto.netns: its signal, or refused
		return err
	}
	if r.rc, err = a.record.Load().Prepare(p); err != nil { // a new record dir or reader: opened, or refused
		r.abort()
		return err
	}
	return nil
}

func (r *newPolicy) abort() {
	if r.src != nil {
		r.src.Close()
	}
	r.rc.Abort()
}

func (r *newPolicy) commit(given, p tiers.Policy, st tiers.State) {
	a := r.a
	a.auto.Load().Reloaded(given, r.src) // the fleet's policy, not its fallback
	a.lic.Load().Reloaded(given)
	a.fleet.reloaded(st.Learnt(given), st.Local)
	r.rc.Commit()
}

// inForce is the rooms' part of applying the policy in force again, with
// a new learnt max, new local addresses or the fleet's fallback: the
// shed record takes the max written, the fleet's fold the learnt max.
type inForce struct{ a *Agent }

func (inForce) prepare(tiers.Policy) error { return nil }

func (inForce) abort() {}

func (r inForce) commit(given, p tiers.Policy, st tiers.State) {
	a := r.a
	if ep := a.record.Load(); ep != nil {
		ep.SetMax(p)
	}
	a.fleet.follow(st.Learnt(given), st.Local)
}

// ReloaderConfig configures a Reloader.
type ReloaderConfig struct {
	// Path is the policy file (YAML or .properties, see tiers.LoadFile).
	// Empty means the embedded default policy, which only SIGHUP reloads
	// (with Mode applied again).
	Path string
	// Mode, when set, overrides the mode of every policy the Reloader
	// reads.
	Mode *tiers.Mode
	// Debounce is how long the file must stay quiet before it is read;
	// zero means DefaultDebounce.
	Debounce time.Duration
	// PollInterval is how often the file's content is read while it
	// cannot be watched (inotify exhausted); zero means
	// DefaultPollInterval.
	PollInterval time.Duration
	// WatchRetry is how often the watch is tried again meanwhile; zero
	// means DefaultWatchRetry.
	WatchRetry time.Duration
	// Logger receives the reload logs; nil discards them.
	Logger *slog.Logger
}

// Reloader is the agent's reload supervisor. It reloads the policy on every
// SIGHUP, and when the content of the config file changes. It watches
// every directory entry on the config path's symlink chain (symlinkChain),
// resolved again after each change: an edit in place, an editor's rename
// over the file, a swapped symlink, a symlinked file edited in another
// directory and a Kubernetes ConfigMap's ..data swap all reload.
//
// A file change reloads only when the content differs from the last
// content read (SHA-256), so an event that changes nothing is neither a
// reload nor an error. A file that cannot be read (missing, not a regular
// file, over tiers.MaxConfigBytes) or that holds a bad policy is one
// logged and counted error; the same failure again is silent until the
// file changes. A SIGHUP always reads, applies, logs and counts.
type Reloader struct {
	cfg   ReloaderConfig
	log   *slog.Logger
	watch *configWatch // nil without a file, or when it cannot be watched
	// poll and retry tick while the file cannot be watched: its content
	// is read every PollInterval (pollSum: what the last poll read), and
	// the watch is tried again every WatchRetry.
	poll, retry *time.Ticker
	pollSum     [sha256.Size]byte

	// lastSum is the content last read; lastErr the failure last logged
	// ("" after a success), and readErr whether it was a failure to read.
	lastSum [sha256.Size]byte
	lastErr string
	readErr bool
}

// NewReloader starts watching cfg.Path, before anything reads it, so that
// no change between the first Load and Run is missed. When the path cannot
// be watched (inotify's instances or watches exhausted), it logs a warning
// and Run polls the file's content instead, and tries the watch again,
// until the watch is live. Close it when done.
func NewReloader(cfg ReloaderConfig) *Reloader {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.WatchRetry <= 0 {
		cfg.WatchRetry = DefaultWatchRetry
	}
	r := &Reloader{cfg: cfg, log: cfg.Logger}
	if cfg.Path != "" {
		w, err := newConfigWatch(cfg.Path)
		if err != nil {
			r.startPolling(err)
		} else {
			r.watch = w
		}
	}
	return r
}

// Load reads and parses the policy (the embedded default without a path)
// and applies Mode. Returns the errors of tiers.ReadFile and tiers.Parse.
func (r *Reloader) Load() (tiers.Policy, error) {
	p := tiers.Default()
	if r.cfg.Path != "" {
		data, err := tiers.ReadFile(r.cfg.Path)
		if err != nil {
			return p, err
		}
		r.lastSum = sha256.Sum256(data)
		if p, err = tiers.Parse(r.cfg.Path, data); err != nil {
			return p, err
		}
	}
	if r.cfg.Mode != nil {
		p.Mode = *r.cfg.Mode
	}
	return p, nil
}

// Close stops watching.
func (r *Reloader) Close() error {
	r.stopPolling()
	if r.watch == nil {
		return nil
	}
	return r.watch.close()
}

// Run reloads into target on every value from hup and on config file
// changes until ctx ends. Signals that arrived before Run (hup buffered
// from the start of the process) reload as soon as it starts. It tells
// target how changes are noticed (ConfigWatch) at the start and whenever
// that changes.
func (r *Reloader) Run(ctx context.Context, target Reloadable, hup <-chan os.Signal) {
	r.pollSum = r.lastSum
	target.ConfigWatch(r.mode())
	var quiet <-chan time.Time
	for {
		var events <-chan fsnotify.Event
		var errs <-chan error
		if r.watch != nil {
			events, errs = r.watch.w.Events, r.watch.w.Errors
		}
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload(ctx, target, "SIGHUP", true)
		case ev, ok := <-events:
			if !ok {
				r.watchLost(target, errors.New("inotify watcher closed"))
			} else if r.watch.relevant(ev) {
				quiet = time.After(r.cfg.Debounce)
			}
		case err, ok := <-errs:
			if !ok {
				r.watchLost(target, errors.New("inotify watcher closed"))
				continue
			}
			if !errors.Is(err, fsnotify.ErrEventOverflow) {
				r.log.Warn("config watch", "error", err)
			}
			quiet = time.After(r.cfg.Debounce) // events may be lost: look
		case <-tickC(r.poll):
			if r.polledChange() {
				quiet = time.After(r.cfg.Debounce)
			}
		case <-tickC(r.retry):
			if r.retryWatch(target) {
				quiet = time.After(r.cfg.Debounce) // it may have changed since the last poll
			}
		case <-quiet:
			quiet = nil
			if r.watch != nil {
				if err := r.watch.rewatch(); err != nil {
					r.watchLost(target, err)
				}
			}
			trigger := "file change"
			if r.watch == nil {
				trigger = "file change (polled)"
			}
			r.reload(ctx, target, trigger, false)
		}
	}
}

// reload reads the file and applies it. Unforced (a file change), it
// skips content it has read before and stays silent about a failure it
// has already reported.
func (r *Reloader) reload(ctx context.Context, target Reloadable, trigger string, forced bool) {
	var data []byte
	var err error
	if r.cfg.Path != "" {
		data, err = tiers.ReadFile(r.cfg.Path)
	}
	if err != nil {
		if !forced && err.Error() == r.lastErr {
			return
		}
		r.fail(target, trigger, err)
		r.readErr = true
		return
	}
	sum := sha256.Sum256(data)
	if !forced && sum == r.lastSum {
		if r.readErr {
			r.lastErr, r.readErr = "", false
			r.log.Info("config file readable again and unchanged: the running policy stays", "trigger", trigger)
		}
		return
	}
	r.lastSum, r.lastErr, r.readErr = sum, "", false
	p := tiers.Default()
	if r.cfg.Path != "" {
		if p, err = tiers.Parse(r.cfg.Path, data); err != nil {
			r.fail(target, trigger, err)
			return
		}
	}
	if r.cfg.Mode != nil {
		p.Mode = *r.cfg.Mode
	}
	if err := target.Reload(ctx, p); err != nil {
		if ctx.Err() != nil {
			r.log.Warn("reload interrupted by shutdown, the old policy keeps running", "trigger", trigger, "error", err)
			return
		}
		r.lastErr = err.Error()
		r.log.Error("reload refused, the old policy keeps running", "trigger", trigger, "error", err)
		return
	}
	r.log.Info("reloaded", "trigger", trigger, "mode", p.Mode.String(), "policy", p.String())
}

// fail logs and counts a reload that got no policy to apply: logged
// first, so that whoever sees the count can find the reason.
func (r *Reloader) fail(target Reloadable, trigger string, err error) {
	r.lastErr, r.readErr = err.Error(), false
	r.log.Error("reload refused, the old policy keeps running", "trigger", trigger, "error", err)
	target.ReloadFailed()
}
