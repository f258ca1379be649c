package agent

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
)

// followRcvBuf is the receive buffer of the address and route
// subscriptions: room for a few thousand route changes (a BGP session
// reset) before the kernel drops messages with ENOBUFS, after which the
// subscription is opened again and the table read in full (followLocal).
const followRcvBuf = 4 << 20

// followRetry is how long followLocal waits before subscribing again
// after a subscription failed or ended.
const followRetry = time.Second

// localFollow is what following the host's destinations counts, for
// /metrics (collectLocal).
type localFollow struct {
	// errors counts subscriptions that could not be opened or ended
	// (ENOBUFS), errors they reported, and failed reads of the local
	// table: each is followed by a full re-read.
	errors atomic.Uint64
	// dests is how many destinations of the host the policy in force
	// counts.
	dests atomic.Int64
}

var (
	localDestsDesc = metric("local_dests", "The host's own destinations (addresses, broadcast, anycast and multicast routes of the local routing table) "+
		"that dests: local rules count in the policy in force.")
	followErrorsDesc = metric("follow_errors_total", "Errors following the host's addresses and routes (a netlink subscription refused, "+
		"overflowed or failing, a read of the local table that failed); each is followed by a full re-read.")
)

// collectLocal emits the local-destination families.
func (a *Agent) collectLocal(ch chan<- prometheus.Metric) {
	gauge(ch, localDestsDesc, float64(a.follow.dests.Load()))
	counter(ch, followErrorsDesc, a.follow.errors.Load())
}

// subscribeLocal subscribes to the address and route changes of the
// agent's namespace until stop is closed. The sockets are opened on a
// thread of that namespace, with no Namespace option: the netlink package
// would then enter the namespace (setns), which needs CAP_SYS_ADMIN, that
// the shipped unit does not give.
func (a *Agent) subscribeLocal(stop <-chan struct{}, errf func(error)) (*events, error) {
	addrs := make(chan netlink.AddrUpdate, 64)
	routes := make(chan netlink.RouteUpdate, 64)
	err := a.inNS(func() error {
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
	ev := newEvents()
	follow(ev, stop, addrs)
	follow(ev, stop, routes)
	return ev, nil
}
