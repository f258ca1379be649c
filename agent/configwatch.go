package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/fsnotify/fsnotify"
)

// maxSymlinkHops is how many symlinks symlinkChain follows, as the kernel's
// path walk does (ELOOP after 40).
const maxSymlinkHops = 40

// chainEntry is one directory entry that a config path's resolution goes
// through: a symlink on the way, or the final file.
type chainEntry struct{ dir, name string }

// symlinkChain resolves path component by component, as the kernel does,
// and returns every directory entry the resolution depends on: each
// symlink met on the way (in the directory that holds it, after the
// symlinks before it are resolved) and the final file. A change to any of
// them, and to nothing else, can change what path reads.
//
// For a Kubernetes ConfigMap mount, /etc/cfg/policy.yaml ->
// ..data/policy.yaml and /etc/cfg/..data -> ..2026_11_30_..., it returns
// (/etc/cfg, policy.yaml), (/etc/cfg, ..data) and (/etc/cfg/..2026_...,
// policy.yaml).
//
// When a component does not exist, the entries up to and including the
// missing one are returned with the error of os.Lstat, so that a watch sees
// the file come back. Returns an error wrapping syscall.ELOOP after
// maxSymlinkHops symlinks.
func symlinkChain(path string) ([]chainEntry, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	var out []chainEntry
	cur, rest := "/", strings.Split(abs, "/")
	for hops := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..": // cur has no symlink in it: its parent is the physical one
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil {
			return append(out, chainEntry{cur, c}), err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if len(rest) == 0 {
				out = append(out, chainEntry{cur, c})
			}
			cur = next
			continue
		}
		out = append(out, chainEntry{cur, c})
		if hops++; hops > maxSymlinkHops {
			return out, &fs.PathError{Op: "resolve", Path: path, Err: syscall.ELOOP}
		}
		target, err := os.Readlink(next)
		if err != nil {
			return out, err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return out, nil
}

// configWatch watches the directory entries of a config path's symlink
// chain (symlinkChain) with inotify, one watch per directory on the chain.
// It reports only events on those entries: the agent's own writes next to
// the config (a log file in the same directory) are not reported.
type configWatch struct {
	path string
	w    *fsnotify.Watcher
	// names holds the watched entries: directory -> names in it.
	names map[string]map[string]bool
}

// newConfigWatch starts watching path's symlink chain. A path that does not
// exist yet is watched for: the directory that would hold it is.
func newConfigWatch(path string) (*configWatch, error) {
	w, err := newWatcher()
	if err != nil {
		return nil, err
	}
	cw := &configWatch{path: path, w: w, names: map[string]map[string]bool{}}
	if err := cw.rewatch(); err != nil {
		w.Close()
		return nil, err
	}
	return cw, nil
}

// rewatch resolves the chain again and moves the watches to it: it adds
// the directories that are new on the chain and removes the ones that left
// it. Call it after each change, since a swapped symlink can point into a
// new directory (a ConfigMap's new ..2026_... directory). It fails only
// when a directory on the chain cannot be watched; a missing file is no
// error (its directory is watched).
func (cw *configWatch) rewatch() error {
	chain, _ := symlinkChain(cw.path)
	names := map[string]map[string]bool{}
	for _, e := range chain {
		if names[e.dir] == nil {
			names[e.dir] = map[string]bool{}
		}
		names[e.dir][e.name] = true
	}
	var errs []error
	for dir := range names {
		if cw.names[dir] != nil {
			continue
		}
		if err := addWatch(cw.w, dir); err != nil {
			errs = append(errs, fmt.Errorf("watch %s: %w", dir, err))
			delete(names, dir)
		}
	}
	for dir := range cw.names {
		if names[dir] == nil {
			_ = cw.w.Remove(dir) // fails when the directory is already gone
		}
	}
	cw.names = names
	return errors.Join(errs...)
}

// relevant reports whether ev concerns an entry of the chain. A directory
// on the chain that is removed or renamed is relevant too.
func (cw *configWatch) relevant(ev fsnotify.Event) bool {
	if !ev.Has(fsnotify.Write | fsnotify.Create | fsnotify.Rename | fsnotify.Remove) {
		return false
	}
	if cw.names[ev.Name] != nil {
		return true
	}
	return cw.names[filepath.Dir(ev.Name)][filepath.Base(ev.Name)]
}

// dirs lists the watched directories.
func (cw *configWatch) dirs() []string {
	out := make([]string, 0, len(cw.names))
	for d := range cw.names {
		out = append(out, d)
	}
	return out
}

func (cw *configWatch) close() error { return cw.w.Close() }
