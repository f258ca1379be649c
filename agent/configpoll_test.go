package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tierlimit/tierlimit/agent/attach"
)

// exhaustInotify makes every new inotify watcher fail, as inotify_init1
// does once fs.inotify.max_user_instances (128 per user by default) is
// used up, while the returned flag is set; it counts the attempts. The
// hook is restored when the test ends, after the Reloaders it started
// (cleanups run last-registered first).
func exhaustInotify(t *testing.T) (exhausted *atomic.Bool, attempts *atomic.Int32) {
	t.Helper()
	exhausted, attempts = new(atomic.Bool), new(atomic.Int32)
	exhausted.Store(true)
	t.Cleanup(func() { newWatcher = fsnotify.NewWatcher })
	newWatcher = func() (*fsnotify.Watcher, error) {
		attempts.Add(1)
		if exhausted.Load() {
			return nil, fmt.Errorf("inotify_init1: %w", syscall.EMFILE)
		}
		return fsnotify.NewWatcher()
	}
	return exhausted, attempts
}

// waitFor polls cond for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool, run *running) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s\n%s", what, run.logs)
		}
	}
}

func (f *fakeTarget) lastMode() WatchMode {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.modes) == 0 {
		return -1
	}
	return f.modes[len(f.modes)-1]
}

// TestReloaderPollsWhenInotifyExhausted (issue 24 part 5): with inotify
// exhausted the Reloader polls the file's content: an edit in place and a
// ConfigMap's ..data swap both apply, the target is told it polls, and the
// watch is tried again until it is live, after which edits apply through
// it.
func TestReloaderPollsWhenInotifyExhausted(t *testing.T) {
	exhausted, attempts := exhaustInotify(t)
	dir := t.TempDir() // a ConfigMap volume: policy.yaml -> ..data/policy.yaml
	write(t, filepath.Join(dir, "..v1", "policy.yaml"), policyYAML(100))
	symlink(t, "..v1", filepath.Join(dir, "..data"))
	symlink(t, "..data/policy.yaml", filepath.Join(dir, "policy.yaml"))
	run := startReloaderWith(t, ReloaderConfig{Path: filepath.Join(dir, "policy.yaml"),
		PollInterval: 50 * time.Millisecond, WatchRetry: 200 * time.Millisecond}, 100)

	waitFor(t, "the target told it polls", func() bool { return run.f.lastMode() == WatchPoll }, run)
	if !strings.Contains(run.logs.String(), "config file not watched: polling its content instead") {
		t.Errorf("no warning that the file is polled:\n%s", run.logs)
	}
	write(t, filepath.Join(dir, "..v1", "policy.yaml"), policyYAML(200)) // in place
	run.expect(t, 200)
	write(t, filepath.Join(dir, "..v2", "policy.yaml"), policyYAML(300))
	swap(t, "..v2", filepath.Join(dir, "..data")) // kubelet's update
	run.expect(t, 300)
	write(t, filepath.Join(dir, "..v2", "policy.yaml"), policyYAML(300))
	run.quiet(t, "the same content written again")

	waitFor(t, "the watch retried", func() bool { return attempts.Load() >= 3 }, run)
	exhausted.Store(false)
	waitFor(t, "the watch live again", func() bool { return run.f.lastMode() == WatchLive }, run)
	if !strings.Contains(run.logs.String(), "config watch live again") {
		t.Errorf("no log that the watch is live again:\n%s", run.logs)
	}
	n := attempts.Load()
	write(t, filepath.Join(dir, "..v3", "policy.yaml"), policyYAML(400))
	swap(t, "..v3", filepath.Join(dir, "..data"))
	run.expect(t, 400)
	time.Sleep(500 * time.Millisecond) // two retry intervals
	if got := attempts.Load(); got != n {
		t.Errorf("%d more watch attempts once the watch was live", got-n)
	}
	if _, failed := run.f.counts(); failed != 0 {
		t.Errorf("%d failed reloads", failed)
	}
}

// TestReloaderWatchLostLater: a live watch that cannot follow the chain
// into a new directory (inotify's watches used up: ENOSPC) falls back to
// polling, still applies that change and the next, and is retried until
// live again.
func TestReloaderWatchLostLater(t *testing.T) {
	exhausted, _ := exhaustInotify(t)
	exhausted.Store(false)
	var noWatches atomic.Bool
	t.Cleanup(func() { addWatch = (*fsnotify.Watcher).Add })
	addWatch = func(w *fsnotify.Watcher, dir string) error {
		if noWatches.Load() {
			return fmt.Errorf("inotify_add_watch %s: %w", dir, syscall.ENOSPC)
		}
		return w.Add(dir)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "..v1", "policy.yaml"), policyYAML(100))
	symlink(t, "..v1", filepath.Join(dir, "..data"))
	symlink(t, "..data/policy.yaml", filepath.Join(dir, "policy.yaml"))
	run := startReloaderWith(t, ReloaderConfig{Path: filepath.Join(dir, "policy.yaml"),
		PollInterval: 50 * time.Millisecond, WatchRetry: 200 * time.Millisecond}, 100)
	waitFor(t, "the watch live", func() bool { return run.f.lastMode() == WatchLive }, run)

	noWatches.Store(true)
	write(t, filepath.Join(dir, "..v2", "policy.yaml"), policyYAML(200))
	swap(t, "..v2", filepath.Join(dir, "..data"))
	run.expect(t, 200)
	waitFor(t, "the target told it polls", func() bool { return run.f.lastMode() == WatchPoll }, run)
	write(t, filepath.Join(dir, "..v2", "policy.yaml"), policyYAML(300))
	run.expect(t, 300)
	noWatches.Store(false)
	waitFor(t, "the watch live again", func() bool { return run.f.lastMode() == WatchLive }, run)
	write(t, filepath.Join(dir, "..v2", "policy.yaml"), policyYAML(400))
	run.expect(t, 400)
}

// TestReloaderWatchLiveFromStart: a Reloader that could watch tells its
// target so, once, and never polls.
func TestReloaderWatchLiveFromStart(t *testing.T) {
	exhausted, attempts := exhaustInotify(t)
	exhausted.Store(false)
	cfg := filepath.Join(t.TempDir(), "policy.yaml")
	write(t, cfg, policyYAML(100))
	run := startReloader(t, cfg, 100)
	waitFor(t, "the target told the watch is live", func() bool { return run.f.lastMode() == WatchLive }, run)
	write(t, cfg, policyYAML(200))
	run.expect(t, 200)
	if attempts.Load() != 1 || strings.Contains(run.logs.String(), "polling") {
		t.Errorf("polled or retried with a live watch:\n%s", run.logs)
	}
}

// TestConfigWatchGauge: the one collector exports how config changes are
// noticed: 1 with mode watch, 0 with mode poll, nothing without a file.
func TestConfigWatchGauge(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), at: attach.New(attach.Config{})}
	c := &collector{a: a, read: func() (Snapshot, error) { return Snapshot{}, errors.New("no maps in this test") }}
	for _, tc := range []struct {
		mode WatchMode
		want string
	}{
		{WatchLive, `tierlimit_config_watch_live{mode="watch"} 1`},
		{WatchPoll, `tierlimit_config_watch_live{mode="poll"} 0`},
		{WatchNone, ``},
	} {
		a.ConfigWatch(tc.mode)
		want := ""
		if tc.want != "" {
			want = "# HELP tierlimit_config_watch_live " + configWatchHelp + "\n# TYPE tierlimit_config_watch_live gauge\n" + tc.want + "\n"
		}
		if err := testutil.CollectAndCompare(c, strings.NewReader(want), "tierlimit_config_watch_live"); err != nil {
			t.Errorf("%v: %v", tc.mode, err)
		}
	}
}
