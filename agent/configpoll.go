package agent

import (
	"crypto/sha256"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/tiers"
)

// While the config file cannot be watched (inotify's 128 instances per
// user, or its watches, used up by other programs), the Reloader reads the
// file's content every DefaultPollInterval and applies it when it changed,
// as the watch would, and tries the watch again every DefaultWatchRetry.
const (
	DefaultPollInterval = 2 * time.Second
	DefaultWatchRetry   = 10 * time.Second
)

// newWatcher makes the inotify watcher of a configWatch, and addWatch adds
// a directory to it; tests replace them to exhaust inotify.
var (
	newWatcher = fsnotify.NewWatcher
	addWatch   = (*fsnotify.Watcher).Add
)

// WatchMode is how a Reloader notices that the config file changed.
type WatchMode int32

const (
	// WatchNone: no config file (the embedded default), nothing to notice.
	WatchNone WatchMode = iota
	// WatchLive: inotify watches the file's symlink chain.
	WatchLive
	// WatchPoll: the watch could not be made; the content is polled.
	WatchPoll
)

func (m WatchMode) String() string {
	switch m {
	case WatchLive:
		return "watch"
	case WatchPoll:
		return "poll"
	}
	return "none"
}

// mode says how changes are noticed now.
func (r *Reloader) mode() WatchMode {
	switch {
	case r.cfg.Path == "":
		return WatchNone
	case r.watch != nil:
		return WatchLive
	}
	return WatchPoll
}

// startPolling switches to polling because the watch failed with err.
func (r *Reloader) startPolling(err error) {
	r.log.Warn("config file not watched: polling its content instead, and retrying the watch",
		"config", r.cfg.Path, "error", err, "poll_interval", r.cfg.PollInterval, "retry_interval", r.cfg.WatchRetry)
	r.pollSum = r.lastSum
	r.poll = time.NewTicker(r.cfg.PollInterval)
	r.retry = time.NewTicker(r.cfg.WatchRetry)
}

func (r *Reloader) stopPolling() {
	if r.poll != nil {
		r.poll.Stop()
		r.retry.Stop()
		r.poll, r.retry = nil, nil
	}
}

// watchLost gives up a watch that stopped working (a directory of the
// chain cannot be watched any more, the watcher closed) and polls.
func (r *Reloader) watchLost(target Reloadable, err error) {
	if r.watch == nil {
		return
	}
	r.watch.close()
	r.watch = nil
	r.startPolling(err)
	target.ConfigWatch(r.mode())
}

// retryWatch tries the watch again; true once it is live, polling stopped.
func (r *Reloader) retryWatch(target Reloadable) bool {
	w, err := newConfigWatch(r.cfg.Path)
	if err != nil {
		return false
	}
	r.stopPolling()
	r.watch = w
	r.log.Info("config watch live again: polling stopped", "config", r.cfg.Path, "dirs", w.dirs())
	target.ConfigWatch(r.mode())
	return true
}

// polledChange reads the file and says whether what it read (its content,
// or why it could not be read) differs from the last poll. A symlink
// swapped to other content (a ConfigMap's ..data) is a change too: the
// path is read through it.
func (r *Reloader) polledChange() bool {
	data, err := tiers.ReadFile(r.cfg.Path)
	sum := sha256.Sum256(data)
	if err != nil {
		sum = sha256.Sum256([]byte("unreadable: " + err.Error()))
	}
	if sum == r.pollSum {
		return false
	}
	r.pollSum = sum
	return true
}

// tickC is t's channel; nil (never ready) for no ticker.
func tickC(t *time.Ticker) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// configWatchDesc is the one family of the config watch: an addition to
// docs/design.md §5's table.
var configWatchDesc = metric("config_watch_live", configWatchHelp, "mode")

const configWatchHelp = "1 while inotify watches the config file (mode watch); 0 while its content is polled because the watch failed (mode poll). Absent without a config file."

// ConfigWatch records how the Reloader notices config changes, for the
// metrics.
func (a *Agent) ConfigWatch(m WatchMode) { a.configWatch.Store(int32(m)) }

// collectConfigWatch emits the config watch's state of snapshot s.
func collectConfigWatch(ch chan<- prometheus.Metric, s Snapshot) {
	switch s.ConfigWatch {
	case WatchLive:
		gauge(ch, configWatchDesc, 1, WatchLive.String())
	case WatchPoll:
		gauge(ch, configWatchDesc, 0, WatchPoll.String())
	}
}
