package agent

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/internal/localaddr"
	"github.com/tierlimit/tierlimit/internal/sysutil"
	"github.com/tierlimit/tierlimit/tiers"
)

// localDests is the host's own destinations, for select rules with
// `dests: local` (the default; DESIGN.md §2, tiers.Rule.Local), from the
// local routing table that nh sees (localaddr.Dests).
func localDests(nh *netlink.Handle) ([]tiers.LocalDest, error) { return localaddr.Dests(nh) }

// LocalPrefixes returns the host's destinations that `dests: local` rules
// count, as last read: UDP rules all of them, TCP rules the unicast ones
// (tiers.LocalDest).
func (a *Agent) LocalPrefixes() []netip.Prefix {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	return localaddr.Prefixes(a.local)
}

// followLocal re-reads the local prefixes whenever an address or a route
// of the agent's namespace changes, until done is closed, and applies the
// policy in force again when they differ: a VIP added to lo, an address
// that a DHCP client renews or one that goes away is counted, or not, from
// then on. Events in a burst (an interface going down drops all its
// addresses) are read as one, after a quiet 50 ms.
func (a *Agent) followLocal(done <-chan struct{}) {
	addrs := make(chan netlink.AddrUpdate, 64)
	routes := make(chan netlink.RouteUpdate, 64)
	errf := subscriptionErrors(a.log, done, "following local addresses")
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{Namespace: &a.at.ns, ErrorCallback: errf}); err != nil {
		a.log.Error("cannot follow local addresses: dests local keeps the addresses of the start", "err", err)
		return
	}
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &a.at.ns, ErrorCallback: errf}); err != nil {
		a.log.Error("cannot follow local routes: dests local keeps the addresses of the start", "err", err)
		return
	}
	ev := sysutil.NewEvents()
	sysutil.Follow(ev, done, addrs)
	sysutil.Follow(ev, done, routes)
	ev.Settle(done, 50*time.Millisecond, a.refreshLocal)
}

// refreshLocal reads the local prefixes and, when they changed, applies
// the policy in force with them.
func (a *Agent) refreshLocal() {
	local, err := localDests(a.at.nh)
	if err != nil {
		a.log.Warn("read local addresses", "err", err)
		return
	}
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if a.closed.Load() || slices.Equal(local, a.local) {
		return
	}
	old := a.local
	a.local = local
	if err := a.apply(context.Background(), a.current, false); err != nil {
		a.local = old
		a.log.Error("apply the policy to new local addresses", "err", err, "local", local)
		return
	}
	a.log.Info("local addresses changed: dests local follows them", "local", localaddr.Prefixes(local))
}
