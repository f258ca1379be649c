package agent

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// inNS runs fn on a locked OS thread in the agent's network namespace.
// Attaching XDP by ifindex (bpf_link_create, netlink's package handle)
// acts on the calling thread's namespace, and Watch may run on any
// goroutine: an ifindex of the agent's namespace must never reach another
// one's interface.
func (a *Agent) inNS(fn func() error) error {
	return onThreadIn(a.ns, "the agent's network namespace", fn)
}

// ErrSignalNetNS is returned by OpenDropSourceIn when the collector-socket
// drop signal cannot be read in the network namespace it names
// (*SignalNetNSError).
var ErrSignalNetNS = errors.New("cannot read the collector socket drops in the network namespace")

// SignalNetNSError is a network namespace (auto.netns) in which the
// adaptive max's signal cannot be read: the path is not a network
// namespace, cannot be opened or entered, or neither sock_diag nor
// /proc/net/snmp answers there.
type SignalNetNSError struct {
	Path string
	Err  error
}

func (e *SignalNetNSError) Error() string {
	return fmt.Sprintf("%v %s: %v", ErrSignalNetNS, e.Path, e.Err)
}

func (e *SignalNetNSError) Unwrap() []error { return []error{ErrSignalNetNS, e.Err} }

// OpenDropSourceIn opens the collector-socket drop signal (OpenDropSource)
// in the network namespace at path, such as /proc/PID/ns/net or
// /run/netns/NAME, where a collector in a container or pod has its sockets
// (DESIGN.md §8); "" is the calling thread's namespace. It enters the
// namespace on a locked OS thread only to open the source, whose netlink
// socket and /proc files stay that namespace's.
func OpenDropSourceIn(path string) (DropSource, error) {
	if path == "" {
		return OpenDropSource(false)
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, &SignalNetNSError{Path: path, Err: err}
	}
	defer h.Close()
	var src DropSource
	err = onThreadIn(h, "the network namespace "+path, func() (err error) {
		src, err = OpenDropSource(false)
		return err
	})
	if err != nil {
		return nil, &SignalNetNSError{Path: path, Err: err}
	}
	return src, nil
}

// onThreadIn runs fn on a locked OS thread inside the network namespace
// h (what names it in errors) and puts the thread back afterwards; a
// thread that cannot go back stays locked and dies with its goroutine.
func onThreadIn(h netns.NsHandle, what string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		cur, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("read network namespace: %w", err)
			return
		}
		defer cur.Close()
		if cur.Equal(h) {
			err = fn()
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter %s: %w", what, err)
			if netns.Set(cur) == nil {
				runtime.UnlockOSThread()
			}
			return
		}
		err = fn()
		if rerr := netns.Set(cur); rerr != nil {
			errc <- fmt.Errorf("restore network namespace: %w (after: %v)", rerr, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
