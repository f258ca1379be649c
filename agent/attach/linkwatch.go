package attach

import (
	"context"
	"time"
)

// Watch checks, every interval until ctx ends, that the limiter is what
// the agent says it is, and repairs what it can:
//   - an interface renamed: its pinned link follows the new name;
//   - an interface deleted: logged; when an interface of the same name
//     appears (a new ifindex), the limiter is attached to it and that is
//     logged;
//   - any other loss (a foreign program, the interface moved to another
//     namespace): logged, and /healthz and xdp_attached show it;
//   - the pin directory, or pins in it, removed: logged, and everything is
//     pinned again from the fds the agent holds.
func (a *Attacher) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		if ctx.Err() == nil && !a.closed() {
			watcher{a}.round()
		}
		a.mu.Unlock()
		// The host's destinations, which an event lost in a storm would
		// leave stale (the agent's follower): afterRound takes the agent's
		// lock of applies, which is never taken under mu.
		if ctx.Err() == nil && a.afterRound != nil {
			a.afterRound()
		}
	}
}

// watcher is Watch's repairs of the Attacher a; a.mu is held.
type watcher struct{ a *Attacher }

// round is one round of Watch.
func (w watcher) round() {
	a := w.a
	for _, att := range a.attached {
		a.followRename(att)
		why := a.check(att)
		if (why == "interface deleted" || att.deleted) && w.reattach(att) {
			continue
		}
		switch {
		case why == "" && att.lost:
			att.lost = false
			a.log.Info("limiter attached again", "iface", att.Iface, "ifindex", att.Index)
		case why != "" && !att.lost:
			att.lost = true
			a.log.Error("limiter no longer attached", "iface", att.Iface, "ifindex", att.Index, "reason", why)
		}
	}
	if a.pd != nil {
		a.pins.check(a.attached, func(att *Attachment) bool { return a.check(att) == "" })
	}
	// A child in another namespace, a sysctl: changes with no event.
	if err := a.host.describe(a.attached); err != nil {
		a.log.Error("describe interfaces to the program", "err", err)
	}
}

// followRename notices that att's interface has a new name (same ifindex,
// the agent's program) and moves its link pin to that name.
func (a *Attacher) followRename(att *Attachment) {
	if a.check(att) != "" {
		return
	}
	l, err := a.nh.LinkByIndex(att.Index)
	if err != nil || l.Attrs().Name == att.Iface {
		return
	}
	old := att.Iface
	att.Iface = l.Attrs().Name
	if a.pd != nil && att.link != nil {
		if err := att.link.Pin(a.pd.LinkPin(att.Iface)); err != nil {
			a.log.Error("interface renamed, but its link could not be pinned under the new name", "from", old, "to", att.Iface, "error", err)
			return
		}
	}
	a.log.Warn("interface renamed: the limiter stays on it", "from", old, "to", att.Iface, "ifindex", att.Index)
}

// reattach drops the link of att's deleted interface and attaches the
// limiter to the interface of that name once there is one again (usually
// on a new ifindex). It reports whether it tried.
func (w watcher) reattach(att *Attachment) bool {
	a := w.a
	if att.link != nil {
		if a.pd != nil {
			a.pins.unpinIfMine(att)
		}
		att.link.Close()
		att.link = nil
	}
	att.deleted = true
	// Any interface of that name is a new one now, even on the old ifindex.
	l, err := a.nh.LinkByName(att.Iface)
	if err != nil {
		return false
	}
	var fresh *Attachment
	err = inNS(a.ns, func() (err error) { fresh, err = a.link.attach(l); return err })
	if err != nil {
		if !att.lost {
			a.log.Error("interface re-created, but attaching the limiter failed", "iface", att.Iface, "ifindex", l.Attrs().Index, "error", err)
		}
		att.lost = true
		return true
	}
	a.log.Warn("interface re-created: limiter attached to it", "iface", att.Iface, "old_ifindex", att.Index,
		"ifindex", fresh.Index, "mode", fresh.Mode, "link_id", fresh.LinkID)
	*att = *fresh
	// The generic-mode gate is keyed by ifindex: the new interface's
	// super-packets count as their datagrams only once it is listed.
	if err := a.host.countSuperPackets(a.attached); err != nil {
		a.log.Error("interface re-created, but its super-packets cannot be counted", "iface", att.Iface, "ifindex", att.Index, "error", err)
	}
	return true
}
