package agent

import (
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
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		cur, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("read network namespace: %w", err)
			return // the thread stays locked and dies with the goroutine
		}
		defer cur.Close()
		if cur.Equal(a.ns) {
			err = fn()
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		if err := netns.Set(a.ns); err != nil {
			errc <- fmt.Errorf("enter the agent's network namespace: %w", err)
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
