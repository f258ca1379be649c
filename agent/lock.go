package agent

import (
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
// agent.
const LockDir = "/run/tierlimit"

// ErrAgentRunning is returned by New and Detach when another agent holds
// the pin path.
var ErrAgentRunning = errors.New("another tierlimit agent is running with this pin path")

// pinLock is an exclusive flock(2) on the pin path's lock file, held for
// the agent's lifetime; the kernel releases it when the process dies, even
// on SIGKILL.
type pinLock struct{ f *os.File }

// LockFile is the lock file of pin path pin.
func LockFile(pin string) string { return lockPath(pin) }

func lockPath(pin string) string {
	name := strings.ReplaceAll(strings.Trim(filepath.Clean(pin), "/"), "/", "_")
	return filepath.Join(LockDir, name+".lock")
}

// lockPin takes the pin path's lock without waiting. Returns
// ErrAgentRunning, naming the holder's pid, when it is taken.
func lockPin(pin string) (*pinLock, error) {
	if err := os.MkdirAll(LockDir, 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", pin, err)
	}
	path := lockPath(pin)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("lock %s: %w (the lock and the pins are root's: run as root, or with CAP_DAC_OVERRIDE)", pin, err)
	}
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", pin, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s, pid %s): stop it first", ErrAgentRunning, pin, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &pinLock{f: f}, nil
}

// LockHolder reports whether an agent holds pin's lock now, and its pid.
func LockHolder(pin string) (pid string, held bool) {
	l, err := lockPin(pin)
	if err == nil {
		l.unlock()
		return "", false
	}
	if !errors.Is(err, ErrAgentRunning) {
		return "", false
	}
	b, _ := os.ReadFile(lockPath(pin))
	return strings.TrimSpace(string(b)), true
}

func (l *pinLock) unlock() {
	if l != nil {
		l.f.Close() // closing the last fd releases the flock
	}
}
