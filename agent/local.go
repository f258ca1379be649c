package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/internal/localaddr"
	"github.com/tierlimit/tierlimit/tiers"
)

// localGroups reads the multicast groups joined in the agent's
// namespace: opened once, by the first dests, from New.
type localGroups struct {
	once sync.Once
	g    *localaddr.Groups
}

// dests is the host's own destinations, for select rules with
// `dests: local` (the default; docs/design.md §2, tiers.Rule.Local), from
// the local routing table that nh sees and the multicast groups joined
// there (localaddr.Dests). Its first call, from New, opens the groups'
// socket in the namespace New runs in; where that fails, multicast is
// counted whole, as before the groups were followed.
func (g *localGroups) dests(nh *netlink.Handle, log *slog.Logger) ([]tiers.LocalDest, error) {
	g.once.Do(func() {
		gs, err := localaddr.OpenGroups()
		if err != nil {
			log.Warn("cannot read the joined multicast groups: dests local counts multicast whole", "err", err)
			return
		}
		g.g = gs
	})
	return localaddr.Dests(nh, g.g)
}

// close closes the groups' socket, if open.
func (g *localGroups) close() {
	if g.g != nil {
		g.g.Close()
	}
}

// LocalPrefixes returns the host's destinations that `dests: local` rules
// count, as last read: UDP rules all of them, TCP rules the unicast ones
// (tiers.LocalDest).
func (a *Agent) LocalPrefixes() []netip.Prefix {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	return localaddr.Prefixes(a.local)
}

// follow re-reads the local prefixes (refresh) whenever an address or a route
// of the agent's namespace changes, until done is closed, and applies the
// policy in force again when they differ: a VIP added to lo, an address
// that a DHCP client renews or one that goes away is counted, or not, from
// then on. Events in a burst (an interface going down drops all its
// addresses) are read as one, after a quiet 50 ms. A subscription that
// cannot be opened, or ends (ENOBUFS after a storm of route changes), is
// counted and opened again, and the full list read again; Watch also
// re-reads it at every round, so that a lost event is never lost for good.
// ns is the agent's namespace, a handle of follow's own (dupNS),
// which it closes.
func (f *localFollow) follow(done <-chan struct{}, ns netns.NsHandle, log *slog.Logger, refresh func()) {
	defer ns.Close()
	failing := false
	for {
		stop := make(chan struct{})
		errf := func(err error) {
			select {
			case <-stop: // the subscription's end, asked for
				return
			default:
			}
			f.errors.Add(1)
			log.Warn("following local addresses: subscription failed: subscribing again and reading the full list", "err", err)
		}
		ev, err := subscribeLocal(ns, stop, errf)
		switch {
		case err != nil:
			f.errors.Add(1)
			if !failing {
				log.Error("cannot follow local addresses: dests local is read again at each watch round only, and subscribing is retried", "err", err)
			}
			failing = true
		default:
			if failing {
				log.Info("following local addresses again")
			}
			failing = false
			refresh() // what changed while no subscription listened
			ev.Settle(done, 50*time.Millisecond, refresh)
		}
		close(stop)
		select {
		case <-done:
			return
		case <-time.After(followRetry):
		}
	}
}

// refreshLocal reads the local prefixes and, when they changed, applies
// the policy in force with them. One at a time (refreshMu): two refreshes
// that overlapped could apply the older read last, and leave an address
// added between the reads uncounted until the next refresh (seen as a
// stale tierlimit_local_dests in TestDestsLocalAfterRouteStorm).
func (a *Agent) refreshLocal() {
	a.refreshMu.Lock()
	defer a.refreshMu.Unlock()
	if a.closed.Load() { // its netlink handle closes with it
		return
	}
	local, err := a.groups.dests(a.at.Handle(), a.log)
	if err != nil {
		a.follow.errors.Add(1)
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
	if err := a.apply(context.Background(), a.given, inForce{a}); err != nil {
		a.local = old
		a.log.Error("apply the policy to new local addresses", "err", err, "local", local)
		return
	}
	a.log.Info("local addresses changed: dests local follows them", "local", localaddr.Prefixes(local))
}
