// Package sysutil holds the small operating-system helpers that several
// rooms of the agent and the test helpers share, each written once: running
// on a locked OS thread in a network namespace (OnThreadIn), the monotonic
// clock of the program's timestamps (Monotonic, Clock), and the debounce
// of netlink subscriptions' updates (Events). It imports nothing of the
// module. Linux only.
package sysutil

import (
	"fmt"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// OnThreadIn runs fn on a locked OS thread inside the network namespace
// h (what names it in errors; netns.None() for the calling thread's own)
// and puts the thread back into the namespace it started in afterwards,
// also when fn moved it (netns.NewNamed). Entering a namespace, or going
// back, needs CAP_SYS_ADMIN: neither happens when the thread is there
// already. A thread that cannot go back stays locked and dies with its
// goroutine. Goroutines that fn starts do not inherit the namespace;
// sockets it opens stay in it.
func OnThreadIn(h netns.NsHandle, what string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		cur, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("read network namespace: %w", err)
			return
		}
		defer cur.Close()
		if h != netns.None() && !cur.Equal(h) {
			if err := netns.Set(h); err != nil {
				errc <- fmt.Errorf("enter %s: %w", what, err)
				if netns.Set(cur) == nil {
					runtime.UnlockOSThread()
				}
				return
			}
		}
		err = fn()
		if rerr := back(cur); rerr != nil {
			errc <- fmt.Errorf("restore network namespace: %w (after: %v)", rerr, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// back puts the calling thread into ns unless it is there.
func back(ns netns.NsHandle) error {
	now, err := netns.Get()
	if err != nil {
		return err
	}
	defer now.Close()
	if now.Equal(ns) {
		return nil
	}
	return netns.Set(ns)
}

// Monotonic is CLOCK_MONOTONIC in ns: the clock of the program's window
// starts (bpf.Window.StartNs) and samples (bpf.Sample.Mono).
func Monotonic() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// Clock is what a controller needs of time; tests pass a fake.
type Clock interface {
	After(d time.Duration) <-chan time.Time
	// Now is CLOCK_MONOTONIC in ns (Monotonic).
	Now() uint64
}

// RealClock is the system's Clock.
type RealClock struct{}

// After is time.After.
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Now is Monotonic, 0 when the clock cannot be read.
func (RealClock) Now() uint64 {
	t, _ := Monotonic()
	return t
}
