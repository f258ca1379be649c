package pin

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// LockDir holds one lock file per pin path, so that two agents never
// share, and `tierlimit detach` never pulls, the pinned state of a running
// agent. The pin directory itself is locked too (Dir), so deleting the
// lock file (a tmpfiles cleanup of /run) lets no second agent in.
const LockDir = "/run/tierlimit"

// LockFile is the lock file of pin path pin, named after its canonical
// path (CanonicalPinPath), so that every spelling of one path shares it.
func LockFile(pin string) string {
	c, err := CanonicalPinPath(pin)
	if err != nil {
		c = filepath.Clean(pin)
	}
	return lockPath(c)
}

func lockPath(canonical string) string {
	name := strings.ReplaceAll(strings.Trim(canonical, "/"), "/", "_")
	return filepath.Join(LockDir, name+".lock")
}

// CanonicalPinPath is pin as an absolute path with its parent's symlinks
// resolved: the identity of the pinned state, whatever spelling was typed
// (relative, "..", a symlink to the bpffs mount).
func CanonicalPinPath(pin string) (string, error) {
	if pin == "" {
		return "", fmt.Errorf("%w: empty", ErrPinPath)
	}
	abs, err := filepath.Abs(pin)
	if err != nil {
		return "", fmt.Errorf("%w %q: %v", ErrPinPath, pin, err)
	}
	dir, base := filepath.Split(abs)
	if base == "" || base == "." || base == ".." {
		return "", fmt.Errorf("%w %q: names no directory", ErrPinPath, pin)
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return filepath.Join(dir, base), nil
}

// flockNB takes an exclusive flock(2) on f without waiting. The kernel
// releases it when the last fd closes, even on SIGKILL.
func flockNB(f *os.File) error {
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
}

// lockRunFile takes the lock file of canonical pin path pin. It retries
// when the file it locked was unlinked or replaced meanwhile, so that two
// processes never hold locks on two different files of one name. Returns
// *AgentRunningError when another process holds it.
func lockRunFile(pin string) (*os.File, error) {
	if err := os.MkdirAll(LockDir, 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", pin, err)
	}
	path := lockPath(pin)
	for range 10 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", pin, err)
		}
		if err := flockNB(f); err != nil {
			pid := holderPid(f)
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, &AgentRunningError{Pin: pin, Pid: pid}
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if sameFile(f, path) {
			// The holder's pid, then the pin path: RecordedPinPaths
			// reads it back (the file's name cannot be decoded).
			if err := f.Truncate(0); err == nil {
				_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"+pin+"\n"), 0)
			}
			return f, nil
		}
		f.Close() // unlinked or replaced after we opened it: try again
	}
	return nil, fmt.Errorf("lock %s: the lock file keeps being replaced", path)
}

// sameFile reports whether path still names the file open as f.
func sameFile(f *os.File, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || unix.Stat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// holderPid is the pid that holds a flock on f's file, from /proc/locks
// (in this process's pid namespace), or "" when none is listed. Unlike a
// pid written into the file, it is never half-written.
func holderPid(f *os.File) string {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return ""
	}
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	locks, err := os.Open("/proc/locks")
	if err != nil {
		return ""
	}
	defer locks.Close()
	sc := bufio.NewScanner(locks)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 1234 00:26:36661 0 EOF"; waiters
		// carry "->" after the number.
		fs := strings.Fields(sc.Text())
		if len(fs) >= 6 && fs[1] == "FLOCK" && fs[5] == id && fs[4] != "0" {
			return fs[4] // 0: the holder is outside this pid namespace
		}
	}
	return ""
}

// LockHolder reports whether an agent holds pin's lock now, and its pid
// ("" when unknown). An empty pin (no pinning) is never held.
func LockHolder(pin string) (pid string, held bool) {
	if pin == "" {
		return "", false
	}
	c, err := CanonicalPinPath(pin)
	if err != nil {
		return "", false
	}
	f, err := os.Open(lockPath(c))
	if err != nil {
		return "", false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		return "", false // our shared lock goes with the fd
	}
	return holderPid(f), true
}
