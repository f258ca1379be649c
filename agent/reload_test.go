package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// These tests drive the Reloader with a fake target: they need no root.

// fakeTarget records what a Reloader applies.
type fakeTarget struct {
	mu      sync.Mutex
	maxes   []int       // max of each applied policy
	failed  int         // ReloadFailed calls
	modes   []WatchMode // ConfigWatch calls
	applied chan int
	// block, when set, holds every reload until it is closed or the
	// reload's ctx ends; started receives once per reload that blocks.
	block   chan struct{}
	started chan struct{}
}

func newFake() *fakeTarget { return &fakeTarget{applied: make(chan int, 100)} }

func (f *fakeTarget) Reload(ctx context.Context, p tiers.Policy) error {
	if f.block != nil {
		f.started <- struct{}{}
		select {
		case <-f.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	f.maxes = append(f.maxes, int(p.Max))
	f.mu.Unlock()
	f.applied <- int(p.Max)
	return nil
}

func (f *fakeTarget) ReloadFailed() {
	f.mu.Lock()
	f.failed++
	f.mu.Unlock()
}

func (f *fakeTarget) ConfigWatch(m WatchMode) {
	f.mu.Lock()
	f.modes = append(f.modes, m)
	f.mu.Unlock()
}

func (f *fakeTarget) counts() (applied, failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.maxes), f.failed
}

func policyYAML(max int) string {
	return fmt.Sprintf("max: %d\nselect: [{proto: udp, ports: [514]}]\n", max)
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// swap replaces the symlink at path atomically, as kubelet and
// configuration-management tools do: a new link renamed over the old.
func swap(t *testing.T, target, path string) {
	t.Helper()
	tmp := path + ".swap"
	symlink(t, target, tmp)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// running is a Reloader running on a fake target.
type running struct {
	r    *Reloader
	f    *fakeTarget
	hup  chan os.Signal
	logs *testenv.SyncBuffer
}

// startReloader loads path (whose policy must have max first) and runs a
// Reloader on it until the test ends.
func startReloader(t *testing.T, path string, first int) *running {
	t.Helper()
	return startReloaderWith(t, ReloaderConfig{Path: path}, first)
}

// startReloaderWith is startReloader with cfg's intervals (Debounce 20 ms
// when unset).
func startReloaderWith(t *testing.T, cfg ReloaderConfig, first int) *running {
	t.Helper()
	logs := &testenv.SyncBuffer{}
	if cfg.Debounce == 0 {
		cfg.Debounce = 20 * time.Millisecond
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	r := NewReloader(cfg)
	p, err := r.Load()
	if err != nil {
		t.Fatal(err)
	}
	if int(p.Max) != first {
		t.Fatalf("first load: max %d, want %d", p.Max, first)
	}
	run := &running{r: r, f: newFake(), hup: make(chan os.Signal, 1), logs: logs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx, run.f, run.hup); close(done) }()
	t.Cleanup(func() { cancel(); <-done; r.Close() })
	return run
}

// expect waits (at most 5 s) for the next applied policy and checks its max.
func (run *running) expect(t *testing.T, max int) {
	t.Helper()
	select {
	case got := <-run.f.applied:
		if got != max {
			t.Fatalf("reloaded max %d, want %d\n%s", got, max, run.logs)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no reload to max %d within 5s\n%s", max, run.logs)
	}
}

// quiet checks that nothing is applied for 10 debounce periods.
func (run *running) quiet(t *testing.T, what string) {
	t.Helper()
	select {
	case got := <-run.f.applied:
		t.Fatalf("%s: reloaded (max %d)\n%s", what, got, run.logs)
	case <-time.After(10 * run.r.cfg.Debounce):
	}
}

// TestReloaderPlainFile: an edit in place and an editor's write-and-rename
// both reload; rewriting the same content and writing other files in the
// directory do not.
func TestReloaderPlainFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "policy.yaml")
	write(t, cfg, policyYAML(100))
	run := startReloader(t, cfg, 100)
	write(t, cfg, policyYAML(200))
	run.expect(t, 200)
	write(t, cfg+".new", policyYAML(300))
	if err := os.Rename(cfg+".new", cfg); err != nil {
		t.Fatal(err)
	}
	run.expect(t, 300)
	write(t, cfg, policyYAML(300))
	write(t, filepath.Join(dir, "agent.log"), "log line\n")
	run.quiet(t, "same content and an unrelated file")
	if _, failed := run.f.counts(); failed != 0 {
		t.Fatalf("%d failed reloads", failed)
	}
}

// TestReloaderSymlinkIntoOtherDir (issue 16 item 2): --config is a symlink
// to a file in another directory. Editing the target in place reloads, and
// so does swapping the symlink to a file in a third directory, after which
// edits there reload and edits of the old target do not.
func TestReloaderSymlinkIntoOtherDir(t *testing.T) {
	root := t.TempDir()
	etc, srv, alt := filepath.Join(root, "etc"), filepath.Join(root, "srv"), filepath.Join(root, "alt")
	write(t, filepath.Join(srv, "policy.yaml"), policyYAML(100))
	write(t, filepath.Join(alt, "policy.yaml"), policyYAML(500))
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(etc, "policy.yaml")
	symlink(t, filepath.Join(srv, "policy.yaml"), cfg)
	run := startReloader(t, cfg, 100)

	write(t, filepath.Join(srv, "policy.yaml"), policyYAML(200)) // in place
	run.expect(t, 200)
	swap(t, filepath.Join(alt, "policy.yaml"), cfg)
	run.expect(t, 500)
	write(t, filepath.Join(alt, "policy.yaml"), policyYAML(600))
	run.expect(t, 600)
	write(t, filepath.Join(srv, "policy.yaml"), policyYAML(700)) // no longer the config
	run.quiet(t, "an edit of the old target")
}

// TestReloaderChainOfSymlinks: a symlink to a symlink in another directory
// whose target is swapped: the middle link's directory is watched too.
func TestReloaderChainOfSymlinks(t *testing.T) {
	root := t.TempDir()
	a, b, c := filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c")
	write(t, filepath.Join(c, "v1.yaml"), policyYAML(100))
	write(t, filepath.Join(c, "v2.yaml"), policyYAML(200))
	if err := os.MkdirAll(a, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(b, 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, "../c/v1.yaml", filepath.Join(b, "current"))
	cfg := filepath.Join(a, "policy.yaml")
	symlink(t, filepath.Join(b, "current"), cfg)
	run := startReloader(t, cfg, 100)
	swap(t, "../c/v2.yaml", filepath.Join(b, "current"))
	run.expect(t, 200)
	write(t, filepath.Join(c, "v2.yaml"), policyYAML(300))
	run.expect(t, 300)
}

// configMap lays out dir as kubelet mounts a ConfigMap: policy.yaml ->
// ..data/policy.yaml, ..data -> a timestamped directory holding the file.
// Each call after the first swaps ..data to a new directory and removes
// the old one, as kubelet's atomic writer does.
func configMap(t *testing.T, dir string, gen int, body string) {
	t.Helper()
	ts := fmt.Sprintf("..2026_11_30_12_00_%02d.%d", gen, gen)
	write(t, filepath.Join(dir, ts, "policy.yaml"), body)
	data := filepath.Join(dir, "..data")
	old, _ := os.Readlink(data)
	if old == "" {
		symlink(t, ts, data)
		symlink(t, "..data/policy.yaml", filepath.Join(dir, "policy.yaml"))
		return
	}
	swap(t, ts, data)
	if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
		t.Fatal(err)
	}
}

// TestReloaderConfigMap: Kubernetes ConfigMap updates (..data swaps)
// reload, each once, and the chain follows the new directory.
func TestReloaderConfigMap(t *testing.T) {
	dir := t.TempDir()
	configMap(t, dir, 1, policyYAML(100))
	run := startReloader(t, filepath.Join(dir, "policy.yaml"), 100)
	for gen := 2; gen <= 4; gen++ {
		configMap(t, dir, gen, policyYAML(100*gen))
		run.expect(t, 100*gen)
	}
	run.quiet(t, "after the last swap")
	if applied, failed := run.f.counts(); applied != 3 || failed != 0 {
		t.Fatalf("applied %d, failed %d; want 3, 0\n%s", applied, failed, run.logs)
	}
	if ds := run.r.watch.dirs(); len(ds) != 2 {
		t.Errorf("watching %v, want the mount and the current data directory", ds)
	}
}

// TestReloaderSIGHUP: a HUP always reloads, even when nothing changed, and
// a HUP that arrived before Run (during startup) reloads once Run starts.
func TestReloaderSIGHUP(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "policy.yaml")
	write(t, cfg, policyYAML(100))
	run := startReloader(t, cfg, 100)
	run.hup <- syscall.SIGHUP
	run.expect(t, 100)

	// A HUP buffered before Run.
	r := NewReloader(ReloaderConfig{Path: cfg})
	defer r.Close()
	if _, err := r.Load(); err != nil {
		t.Fatal(err)
	}
	hup := make(chan os.Signal, 1)
	hup <- syscall.SIGHUP
	f := newFake()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx, f, hup)
	select {
	case got := <-f.applied:
		if got != 100 {
			t.Fatalf("max %d", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a HUP sent before Run did not reload")
	}
}

// TestReloaderDeletedWhileLogging (issue 11 case 9): the config is deleted
// while something keeps writing into its directory (the agent's log file):
// one error, counted once, then silence; when the file comes back with new
// content it reloads, and back with the old content it says so, once.
func TestReloaderDeletedWhileLogging(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "policy.yaml")
	write(t, cfg, policyYAML(100))
	run := startReloader(t, cfg, 100)
	if err := os.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	for i := range 50 {
		fmt.Fprintf(logf, "level=ERROR line %d\n", i)
		time.Sleep(5 * time.Millisecond)
	}
	run.quiet(t, "deleted config")
	if n := strings.Count(run.logs.String(), "level=ERROR"); n != 1 {
		t.Fatalf("%d error lines for one deletion, want 1:\n%s", n, run.logs)
	}
	if _, failed := run.f.counts(); failed != 1 {
		t.Fatalf("%d failed reloads counted, want 1", failed)
	}
	write(t, cfg, policyYAML(100)) // back, unchanged
	run.quiet(t, "config back unchanged")
	if !strings.Contains(run.logs.String(), "readable again and unchanged") {
		t.Errorf("no note that the config came back:\n%s", run.logs)
	}
	write(t, cfg, policyYAML(200))
	run.expect(t, 200)
	if _, failed := run.f.counts(); failed != 1 {
		t.Fatalf("%d failed reloads counted, want 1", failed)
	}
}

// TestReloaderRefusesNonRegular (issue 11 case 7): the config replaced by a
// FIFO with no writer (a blocking read would hang the agent), by a
// directory, and by a file over tiers.MaxConfigBytes: one refused reload
// each, naming the reason, and the Reloader goes on working.
func TestReloaderRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "policy.yaml")
	write(t, cfg, policyYAML(100))
	run := startReloader(t, cfg, 100)
	replace := func(make func(tmp string) error) {
		t.Helper()
		tmp := filepath.Join(dir, "next")
		if err := make(tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(cfg); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfg); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		make func(string) error
		want error
	}{
		{func(p string) error { return syscall.Mkfifo(p, 0o600) }, tiers.ErrNotRegular},
		{func(p string) error { return os.Mkdir(p, 0o755) }, tiers.ErrNotRegular},
		{func(p string) error { return os.WriteFile(p, bytes.Repeat([]byte("#"), tiers.MaxConfigBytes+1), 0o644) }, tiers.ErrTooLarge},
	}
	for i, c := range cases {
		replace(c.make)
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, failed := run.f.counts(); failed == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("case %d (%v): no refused reload\n%s", i, c.want, run.logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !strings.Contains(run.logs.String(), c.want.Error()) {
			t.Fatalf("log lacks %q:\n%s", c.want, run.logs)
		}
	}
	replace(func(p string) error { return os.WriteFile(p, []byte(policyYAML(900)), 0o644) })
	run.expect(t, 900)
}

// TestReloaderBadPolicyOnce: a bad policy is one refused reload; events that
// leave it as it is do not repeat the error.
func TestReloaderBadPolicyOnce(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "policy.yaml")
	write(t, cfg, policyYAML(100))
	run := startReloader(t, cfg, 100)
	write(t, cfg, "max: -1\n")
	deadline := time.Now().Add(5 * time.Second)
	for _, failed := run.f.counts(); failed == 0; _, failed = run.f.counts() {
		if time.Now().After(deadline) {
			t.Fatalf("bad policy not refused\n%s", run.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	write(t, cfg, "max: -1\n")
	run.quiet(t, "bad policy rewritten unchanged")
	if _, failed := run.f.counts(); failed != 1 {
		t.Fatalf("%d failed reloads, want 1\n%s", failed, run.logs)
	}
}

func TestSymlinkChain(t *testing.T) {
	dir := t.TempDir()
	configMap(t, dir, 1, policyYAML(1))
	chain, err := symlinkChain(filepath.Join(dir, "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := []chainEntry{{dir, "policy.yaml"}, {dir, "..data"}, {filepath.Join(dir, "..2026_11_30_12_00_01.1"), "policy.yaml"}}
	if !slices.Equal(chain, want) {
		t.Errorf("chain %v, want %v", chain, want)
	}
	chain, err = symlinkChain(filepath.Join(dir, "missing", "policy.yaml"))
	if !errors.Is(err, os.ErrNotExist) || !slices.Equal(chain, []chainEntry{{dir, "missing"}}) {
		t.Errorf("missing dir: %v %v", chain, err)
	}
	loop := filepath.Join(dir, "loop")
	symlink(t, "loop", loop)
	if _, err := symlinkChain(loop); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("symlink loop: %v, want ELOOP", err)
	}
}

// TestReloaderShutdownInterruptsReload: a reload still writing when the
// agent stops (ctx ends: SIGTERM) gives up at once, keeps the old policy,
// and is not counted as a refused reload.
func TestReloaderShutdownInterruptsReload(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "policy.yaml")
	write(t, cfg, policyYAML(100))
	logs := &testenv.SyncBuffer{}
	r := NewReloader(ReloaderConfig{Path: cfg, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	defer r.Close()
	if _, err := r.Load(); err != nil {
		t.Fatal(err)
	}
	f := newFake()
	f.block, f.started = make(chan struct{}), make(chan struct{}, 1)
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx, f, hup); close(done) }()
	hup <- syscall.SIGHUP
	select {
	case <-f.started:
	case <-time.After(5 * time.Second):
		t.Fatal("the HUP's reload did not start")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		close(f.block)
		t.Fatal("Run did not return while a reload was in progress: shutdown waits for the reload")
	}
	if applied, failed := f.counts(); applied != 0 || failed != 0 {
		t.Errorf("applied %d, failed %d; want 0, 0", applied, failed)
	}
	if !strings.Contains(logs.String(), "reload interrupted by shutdown") {
		t.Errorf("log lacks the interrupted reload:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "reload refused") {
		t.Errorf("an interrupted reload was logged as refused:\n%s", logs.String())
	}
}
