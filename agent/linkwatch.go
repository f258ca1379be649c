package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf/link"
)

// Attached reports whether the limiter is attached to every interface:
// each one, in the agent's network namespace, runs the agent's own program
// (by program id) through the agent's link. A program that is not the
// agent's on a reused ifindex is not attached.
func (a *Agent) Attached() bool {
	if a.closed.Load() {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.attached) == 0 {
		return false
	}
	for _, att := range a.attached {
		if a.check(att) != "" {
			return false
		}
	}
	return true
}

// attachedTo reports whether the attachment on ifindex is healthy and the
// agent is open (xdp_attached).
func (a *Agent) attachedTo(ifindex int) bool {
	if a.closed.Load() {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, att := range a.attached {
		if att.Index == ifindex {
			return a.check(att) == ""
		}
	}
	return false
}

// check returns "" when att's interface runs the agent's program through
// att's link, else what is wrong.
func (a *Agent) check(att *Attachment) string {
	if att.link != nil {
		info, err := att.link.Info()
		if err != nil || info.XDP() == nil {
			return fmt.Sprintf("link info: %v", err)
		}
		if info.XDP().Ifindex == 0 {
			return "interface deleted"
		}
	}
	l, err := a.nh.LinkByIndex(att.Index)
	if err != nil {
		return "interface gone from the namespace"
	}
	x := l.Attrs().Xdp
	switch {
	case x == nil || !x.Attached:
		return "no XDP program on the interface"
	case x.ProgId != a.progID:
		return fmt.Sprintf("the interface runs another XDP program (%s), not the agent's (id %d)", describeProgram(x.ProgId), a.progID)
	}
	return ""
}

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
func (a *Agent) Watch(ctx context.Context, interval time.Duration) {
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
	}
}

// watchOnce is one round of Watch; a.mu is held.
func (a *Agent) watchOnce() {
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
}

// followRename notices that att's interface has a new name (same ifindex,
// the agent's program) and moves its link pin to that name.
func (a *Agent) followRename(att *Attachment) {
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
		if err := att.link.Pin(a.pd.linkPin(att.Iface)); err != nil {
			a.log.Error("interface renamed, but its link could not be pinned under the new name", "from", old, "to", att.Iface, "error", err)
			return
		}
	}
	a.log.Warn("interface renamed: the limiter stays on it", "from", old, "to", att.Iface, "ifindex", att.Index)
}

// reattach drops the link of att's deleted interface and attaches the
// limiter to the interface of that name once there is one again (usually
// on a new ifindex). It reports whether it tried.
func (a *Agent) reattach(att *Attachment) bool {
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
func (a *Agent) unpinIfMine(att *Attachment) {
	if a.linkPinned(att) {
		_ = os.Remove(a.pd.linkPin(att.Iface))
	}
}

// linkPinned reports whether att's link is pinned where it belongs.
func (a *Agent) linkPinned(att *Attachment) bool {
	if a.pd == nil || att.link == nil {
		return false
	}
	lk, err := link.LoadPinnedLink(a.pd.linkPin(att.Iface), nil)
	if err != nil {
		return false
	}
	defer lk.Close()
	return linkID(lk) == att.LinkID
}

// checkPins pins the maps, links and program again when the pin directory
// or anything in it was removed under the running agent.
func (a *Agent) checkPins() {
	_, perr := os.Stat(a.pd.program())
	intact := a.pd.intact() && perr == nil && a.lim.PinnedMaps(a.pd.maps())
	for _, att := range a.attached {
		if att.link != nil && a.check(att) == "" && !a.linkPinned(att) {
			intact = false
		}
	}
	if intact {
		return
	}
	if !a.pinsLost {
		a.log.Error("pinned state removed while the agent runs: pinning it again from the agent's fds", "pin", a.pd.path)
	}
	if err := a.repin(); err != nil {
		if !a.pinsLost {
			a.log.Error("pinning again failed: the limiter ends when the agent exits", "pin", a.pd.path, "error", err)
		}
		a.pinsLost = true
		return
	}
	a.pinsLost = false
	a.log.Info("pinned state restored", "pin", a.pd.path)
}

func (a *Agent) repin() error {
	if !a.pd.intact() {
		if err := a.pd.relock(); err != nil {
			return err
		}
	} else if err := a.pd.makeSubdirs(); err != nil {
		return err
	}
	if err := a.lim.Repin(a.pd.maps()); err != nil {
		return err
	}
	for _, att := range a.attached {
		if att.link == nil || a.check(att) != "" || a.linkPinned(att) {
			continue
		}
		path := a.pd.linkPin(att.Iface)
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
	return a.pd.pinProgram(a.lim.Program())
}

// closeOne lets go of att when the agent stops, and logs what is really
// left on the interface.
func (a *Agent) closeOne(att *Attachment) {
	a.followRename(att) // name the interface as it is called now
	why := a.check(att)
	if a.pd == nil {
		if why != "" {
			if att.link != nil {
				att.link.Close()
			}
			a.log.Warn("limiter was not attached any more: nothing to detach", "iface", att.Iface, "ifindex", att.Index, "reason", why)
			return
		}
		a.detachOne(att)
		a.log.Info("detached", "iface", att.Iface)
		return
	}
	pinned := a.linkPinned(att)
	outlives, fsWhy := a.pinsOutlive()
	if att.link != nil {
		att.link.Close()
	}
	switch {
	case why != "":
		a.log.Warn("interface no longer runs the limiter", "iface", att.Iface, "ifindex", att.Index, "reason", why)
	case att.link != nil && !pinned:
		a.log.Error("the limiter's pinned link is gone: the limiter is detached as the agent exits", "iface", att.Iface, "pin", a.pd.path)
	case att.link == nil:
		a.log.Info("limiter stays attached (through netlink, not pinned)", "iface", att.Iface)
	case !outlives:
		a.log.Error("the limiter's pins end with the agent's bpffs: the limiter is detached as the agent exits", "iface", att.Iface, "pin", a.pd.path, "reason", fsWhy)
	default:
		a.log.Info("limiter stays attached and pinned", "iface", att.Iface, "pin", a.pd.path, "link", a.pd.linkPin(att.Iface))
	}
}
