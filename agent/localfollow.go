package agent

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/sysutil"
	"github.com/tierlimit/tierlimit/tiers"
)

// followRcvBuf is the receive buffer of the address and route
// subscriptions: room for a few thousand route changes (a BGP session
// reset) before the kernel drops messages with ENOBUFS, after which the
// subscription is opened again and the table read in full (localFollow.follow).
const followRcvBuf = 4 << 20

// followRetry is how long localFollow.follow waits before subscribing again
// after a subscription failed or ended.
const followRetry = time.Second

// localFollow is what following the host's destinations counts, for
// /metrics (collect).
type localFollow struct {
	// errors counts subscriptions that could not be opened or ended
	// (ENOBUFS), errors they reported, and failed reads of the local
	// table: each is followed by a full re-read.
	errors atomic.Uint64
	// dests is how many destinations of the host the policy in force
	// was resolved with; uncounted how many of them it leaves out
	// (fit).
	dests, uncounted atomic.Int64
}

var (
	localDestsDesc = metric("local_dests", "The host's own destinations (addresses, broadcast, anycast and multicast routes of the local routing table) "+
		"that dests: local rules count in the policy in force.")
	followErrorsDesc = metric("follow_errors_total", "Errors following the host's addresses and routes (a netlink subscription refused, "+
		"overflowed or failing, a read of the local table that failed); each is followed by a full re-read.")
)

// collect emits the local-destination families.
func (f *localFollow) collect(ch chan<- prometheus.Metric) {
	gauge(ch, localDestsDesc, float64(f.dests.Load()))
	counter(ch, followErrorsDesc, f.errors.Load())
	gauge(ch, localUncountedDesc, float64(f.uncounted.Load()))
}

// subscribeLocal subscribes to the address and route changes of the
// agent's namespace, ns, until stop is closed. The sockets are opened on a
// thread of that namespace, with no Namespace option: the netlink package
// would then enter the namespace (setns), which needs CAP_SYS_ADMIN, that
// the shipped unit does not give.
func subscribeLocal(ns netns.NsHandle, stop <-chan struct{}, errf func(error)) (*sysutil.Events, error) {
	addrs := make(chan netlink.AddrUpdate, 64)
	routes := make(chan netlink.RouteUpdate, 64)
	err := sysutil.OnThreadIn(ns, "the agent's network namespace", func() error {
		ao := netlink.AddrSubscribeOptions{ErrorCallback: errf, ReceiveBufferSize: followRcvBuf, ReceiveBufferForceSize: true}
		if err := netlink.AddrSubscribeWithOptions(addrs, stop, ao); err != nil {
			return fmt.Errorf("subscribe to address changes: %w", err)
		}
		ro := netlink.RouteSubscribeOptions{ErrorCallback: errf, ReceiveBufferSize: followRcvBuf, ReceiveBufferForceSize: true}
		if err := netlink.RouteSubscribeWithOptions(routes, stop, ro); err != nil {
			return fmt.Errorf("subscribe to route changes: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ev := sysutil.NewEvents()
	sysutil.Follow(ev, stop, addrs)
	sysutil.Follow(ev, stop, routes)
	return ev, nil
}

var localUncountedDesc = metric("local_dests_uncounted", "The host's own destinations that dests: local rules do not count, "+
	"because the policy's dests and the host's destinations together would take more than the destination trie holds (one entry per destination, however many rules name it).")

// count takes how the host's destinations fit the policy in force
// (tiers.FitLocal), for /metrics: how many it was resolved with, and how
// many it leaves out. A host over the limit is a condition of the running
// agent, logged as an error and shown in tierlimit_local_dests_uncounted,
// never a policy refused (applyMu held).
func (f *localFollow) count(fit tiers.LocalFit, log *slog.Logger) {
	host := len(fit.Kept) + fit.Uncounted
	f.dests.Store(int64(host))
	left := int64(fit.Uncounted)
	if old := f.uncounted.Swap(left); old != left {
		switch {
		case left > 0:
			log.Error("the host has more destinations than dests: local rules can count: the rest are uncounted", "uncounted", left,
				"destinations", host, "entries", fit.Entries, "at_most", fit.Budget)
		case old > 0:
			log.Info("dests local counts all of the host's destinations again", "destinations", host)
		}
	}
}

// dupNS is a handle of its own on the namespace h, for a goroutine that
// outlives the call and must not read the agent's, which Close closes;
// netns.None() when it cannot be had (subscribing then fails, and is
// retried or logged).
func dupNS(h netns.NsHandle) netns.NsHandle {
	fd, err := unix.FcntlInt(uintptr(h), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None()
	}
	return netns.NsHandle(fd)
}
