package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf/link"

	"github.com/tierlimit/tierlimit/agent/pin"
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
func (a *attacher) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		if ctx.Err() == nil && !a.closed.Load() {
			a.watchOnce()
		}
		a.mu.Unlock()
		// The host's destinations, which an event lost in a storm would
		// leave stale (the Agent's follow.follow): afterRound takes applyMu,
		// which is never taken under mu.
		if ctx.Err() == nil && a.afterRound != nil {
			a.afterRound()
		}
	}
}

// watchOnce is one round of Watch; a.mu is held.
func (a *attacher) watchOnce() {
	for _, att := range a.attached {
		a.followRename(att)
		why := a.check(att)
		if (why == "interface deleted" || att.deleted) && a.reattach(att) {
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
		a.checkPins()
	}
	// A child in another namespace, a sysctl: changes with no event.
	if err := a.describeIfaces(); err != nil {
		a.log.Error("describe interfaces to the program", "err", err)
	}
}

// followRename notices that att's interface has a new name (same ifindex,
// the agent's program) and moves its link pin to that name.
func (a *attacher) followRename(att *Attachment) {
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
func (a *attacher) reattach(att *Attachment) bool {
	if att.link != nil {
		if a.pd != nil {
			a.unpinIfMine(att)
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
	err = a.inNS(func() (err error) { fresh, err = a.attach(l); return err })
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
	if err := a.countSuperPackets(); err != nil {
		a.log.Error("interface re-created, but its super-packets cannot be counted", "iface", att.Iface, "ifindex", att.Index, "error", err)
	}
	return true
}

// unpinIfMine removes att's link pin if it holds att's link.
func (a *attacher) unpinIfMine(att *Attachment) {
	if a.linkPinned(att) {
		_ = os.Remove(a.pd.LinkPin(att.Iface))
	}
}

// linkPinned reports whether att's link is pinned where it belongs.
func (a *attacher) linkPinned(att *Attachment) bool {
	if a.pd == nil || att.link == nil {
		return false
	}
	lk, err := link.LoadPinnedLink(a.pd.LinkPin(att.Iface), nil)
	if err != nil {
		return false
	}
	defer lk.Close()
	return linkID(lk) == att.LinkID
}

// checkPins pins the maps, links and program again when the pin directory
// or anything in it was removed under the running agent.
func (a *attacher) checkPins() {
	_, perr := os.Stat(a.pd.Program())
	intact := a.pd.Intact() && perr == nil && a.lim.PinnedMaps(a.pd.Maps())
	for _, att := range a.attached {
		if att.link != nil && a.check(att) == "" && !a.linkPinned(att) {
			intact = false
		}
	}
	if intact {
		return
	}
	if !a.pinsLost {
		a.log.Error("pinned state removed while the agent runs: pinning it again from the agent's fds", "pin", a.pd.Path())
	}
	if err := a.repin(); err != nil {
		if !a.pinsLost {
			a.log.Error("pinning again failed: the limiter ends when the agent exits", "pin", a.pd.Path(), "error", err)
		}
		a.pinsLost = true
		return
	}
	a.pinsLost = false
	a.log.Info("pinned state restored", "pin", a.pd.Path())
}

func (a *attacher) repin() error {
	if !a.pd.Intact() {
		if err := a.pd.Relock(); err != nil {
			return err
		}
	} else if err := a.pd.MakeSubdirs(); err != nil {
		return err
	}
	if err := a.lim.Repin(a.pd.Maps()); err != nil {
		return err
	}
	for _, att := range a.attached {
		if att.link == nil || a.check(att) != "" || a.linkPinned(att) {
			continue
		}
		path := a.pd.LinkPin(att.Iface)
		if err := att.link.Unpin(); err != nil {
			return err
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := att.link.Pin(path); err != nil {
			return fmt.Errorf("pin link %s: %w", path, err)
		}
	}
	if err := a.pd.PinProgram(a.lim.Program()); err != nil {
		return err
	}
	return pin.WriteLayout(a.pd.Path(), a.cfg.Version)
}
