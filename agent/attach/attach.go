package attach

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/agent/pin"
)

// checkEthernet returns a *LinkTypeError unless l's frames start with an
// Ethernet header: its link type (ARPHRD) is Ethernet, or loopback, whose
// frames carry a zeroed one.
func checkEthernet(l netlink.Link) error {
	switch t := l.Attrs().EncapType; t {
	case "ether", "loopback":
		return nil
	default:
		return &LinkTypeError{Iface: l.Attrs().Name, Type: t}
	}
}

// linker attaches the program to one interface at a time.
type linker struct {
	*env
	pins *pins
}

// attach attaches the program to l, or adopts the link pinned for it and
// updates its program in place, so the interface is never without XDP.
func (a *linker) attach(l netlink.Link) (*Attachment, error) {
	name, idx := l.Attrs().Name, l.Attrs().Index
	if err := checkEthernet(l); err != nil {
		return nil, err
	}
	att := &Attachment{Iface: name, Index: idx}
	// restore is the mode the interface ran in before a mode switch: if the
	// new mode is refused, the limiter goes back on in that one.
	var restore XDPMode
	if a.pd != nil {
		adopted, r, err := a.adopt(att)
		if err != nil {
			return nil, err
		}
		if adopted {
			return att, nil
		}
		restore = r
		if l, err = a.nh.LinkByIndex(idx); err != nil {
			return nil, fmt.Errorf("interface %q: %w", name, pin.ErrNoInterface)
		}
	}
	if err := a.clearForeign(l); err != nil {
		return nil, err
	}
	if err := a.attachMode(att, l); err != nil {
		return nil, a.restore(att, restore, err)
	}
	att.Mode = pin.XDPModeOf(a.nh, idx)
	return att, a.pins.pinLink(att)
}

// adopt takes over the link pinned for att's interface and runs this
// agent's program on it. With an explicit mode other than the link's, it
// removes the link instead (a link cannot change mode) and returns the old
// mode, so that attach can put it back if the new one is refused.
func (a *linker) adopt(att *Attachment) (adopted bool, restore XDPMode, err error) {
	path := a.pd.LinkPin(att.Iface)
	lk, err := pin.AdoptLink(path, att.Index)
	if err != nil || lk == nil {
		return false, "", err
	}
	cur := pin.XDPModeOf(a.nh, att.Index)
	if want := string(a.cfg.XDPMode); a.cfg.XDPMode != XDPAuto && want != cur {
		a.log.Warn("switching XDP mode: the interface is without the limiter for a moment",
			"iface", att.Iface, "from", cur, "to", want)
		_ = lk.Unpin()
		lk.Close()
		return false, XDPMode(cur), nil
	}
	if err := lk.Update(a.lim.Program()); err != nil {
		lk.Close()
		return false, "", fmt.Errorf("update pinned link %s: %w", path, err)
	}
	att.link, att.Mode, att.LinkID = lk, cur, linkID(lk)
	a.log.Info("adopted pinned link, program replaced in place", "iface", att.Iface, "pin", path)
	return true, "", nil
}

// clearForeign checks that l runs no XDP program, or removes a foreign one
// when the config allows it (only a netlink attachment can be removed).
func (a *linker) clearForeign(l netlink.Link) error {
	x := l.Attrs().Xdp
	if x == nil || !x.Attached {
		return nil
	}
	name, idx := l.Attrs().Name, l.Attrs().Index
	owner, pname := pin.DescribeProgram(x.ProgId), pin.ProgramNameOf(x.ProgId)
	if pname == pin.ProgramName {
		return &pin.BusyError{Iface: name, Program: owner}
	}
	if !a.cfg.Replace {
		return &pin.ForeignProgramError{Iface: name, Program: owner, Unnamed: pname == ""}
	}
	a.log.Warn("replacing XDP program", "iface", name, "program", owner)
	for _, f := range []int{nl.XDP_FLAGS_DRV_MODE, nl.XDP_FLAGS_SKB_MODE} {
		_ = netlink.LinkSetXdpFdWithFlags(l, -1, f)
	}
	if l, err := a.nh.LinkByIndex(idx); err == nil && l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached {
		return &pin.ForeignProgramError{Iface: name, Program: owner, HeldByLink: true}
	}
	return nil
}

// attachMode attaches in the configured mode; auto tries native, then
// generic. A program that appeared meanwhile (another agent won the race)
// is a *BusyError.
func (a *linker) attachMode(att *Attachment, l netlink.Link) error {
	var err error
	switch a.cfg.XDPMode {
	case XDPAuto:
		if err = a.try(att, l, XDPNative); err != nil && !taken(err) {
			a.log.Warn("native XDP refused, falling back to generic", "iface", att.Iface, "reason", err,
				"hint", nativeHint("/sys/class/net", att.Iface, err))
			err = a.try(att, l, XDPGeneric)
		}
	default:
		err = a.try(att, l, a.cfg.XDPMode)
	}
	switch {
	case err == nil:
		return nil
	case taken(err):
		prog := "an XDP program"
		if cur, e := a.nh.LinkByIndex(att.Index); e == nil && cur.Attrs().Xdp != nil {
			prog = pin.DescribeProgram(cur.Attrs().Xdp.ProgId)
		}
		return &pin.BusyError{Iface: att.Iface, Program: prog}
	case a.cfg.XDPMode == XDPNative:
		// bpf_link creation carries no extack: the errno is all the
		// kernel says. EOPNOTSUPP means the driver has no native XDP.
		if h := nativeHint("/sys/class/net", att.Iface, err); h != "" {
			return fmt.Errorf("%w: %w; %s", ErrNativeRefused, err, h)
		}
		return fmt.Errorf("%w: %w", ErrNativeRefused, err)
	}
	return fmt.Errorf("%s mode: %w", a.cfg.XDPMode, err)
}

// taken reports an attach refused because a program is already there.
func taken(err error) bool { return errors.Is(err, unix.EEXIST) || errors.Is(err, unix.EBUSY) }

// try attaches in mode through a bpf_link, or through netlink where the
// kernel has no XDP links.
func (a *linker) try(att *Attachment, l netlink.Link, mode XDPMode) error {
	flags, lflags := nl.XDP_FLAGS_DRV_MODE, link.XDPDriverMode
	if mode == XDPGeneric {
		flags, lflags = nl.XDP_FLAGS_SKB_MODE, link.XDPGenericMode
	}
	prog := a.lim.Program()
	lk, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: att.Index, Flags: lflags})
	if errors.Is(err, ebpf.ErrNotSupported) {
		a.log.Warn("no XDP bpf_link support, attaching through netlink (not pinnable)", "iface", att.Iface)
		if err := netlink.LinkSetXdpFdWithFlags(l, prog.FD(), flags|nl.XDP_FLAGS_UPDATE_IF_NOEXIST); err != nil {
			return err
		}
		att.flags = flags
		return nil
	}
	if err != nil {
		return err
	}
	att.link, att.LinkID = lk, linkID(lk)
	return nil
}

// restore puts the limiter back in mode prev after a refused mode switch,
// and returns the error to report.
func (a *linker) restore(att *Attachment, prev XDPMode, err error) error {
	if prev != XDPNative && prev != XDPGeneric {
		return err
	}
	l, lerr := a.nh.LinkByIndex(att.Index)
	if lerr != nil {
		return fmt.Errorf("%w; the interface is gone", err)
	}
	if rerr := a.try(att, l, prev); rerr != nil {
		return fmt.Errorf("%w; putting the limiter back in %s mode failed too: %v", err, prev, rerr)
	}
	if perr := a.pins.pinLink(att); perr != nil {
		return fmt.Errorf("%w; the limiter is back in %s mode but could not be pinned: %v", err, prev, perr)
	}
	if att.link != nil {
		att.link.Close() // pinned: it stays attached
	}
	return fmt.Errorf("%w; the limiter stays attached in %s mode", err, prev)
}

func linkID(lk link.Link) uint32 {
	info, err := lk.Info()
	if err != nil {
		return 0
	}
	return uint32(info.ID)
}

// detachOne removes att's attachment (unpinned agents).
func (a *Attacher) detachOne(att *Attachment) {
	if att.link != nil {
		if err := att.link.Close(); err != nil {
			a.log.Warn("detach", "iface", att.Iface, "error", err)
		}
		return
	}
	_ = inNS(a.ns, func() error {
		l, err := a.nh.LinkByIndex(att.Index)
		if err == nil {
			err = netlink.LinkSetXdpFdWithFlags(l, -1, att.flags)
		}
		return err
	})
}

// closeOne lets go of att when the agent stops, and logs what is really
// left on the interface.
func (a *Attacher) closeOne(att *Attachment) {
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
	pinned := a.pins.linkPinned(att)
	outlives, fsWhy := a.pd.Outlives()
	if att.link != nil {
		att.link.Close()
	}
	switch {
	case why != "":
		a.log.Warn("interface no longer runs the limiter", "iface", att.Iface, "ifindex", att.Index, "reason", why)
	case att.link != nil && !pinned:
		a.log.Error("the limiter's pinned link is gone: the limiter is detached as the agent exits", "iface", att.Iface, "pin", a.pd.Path())
	case att.link == nil:
		a.log.Info("limiter stays attached (through netlink, not pinned)", "iface", att.Iface)
	case !outlives:
		a.log.Error("the limiter's pins end with the agent's bpffs: the limiter is detached as the agent exits", "iface", att.Iface, "pin", a.pd.Path(), "reason", fsWhy)
	default:
		a.log.Info("limiter stays attached and pinned", "iface", att.Iface, "pin", a.pd.Path(), "link", a.pd.LinkPin(att.Iface))
	}
}

// Attached reports whether the limiter is attached to every interface:
// each one, in the agent's network namespace, runs the agent's own program
// (by program id) through the agent's link. A program that is not the
// agent's on a reused ifindex is not attached.
func (a *Attacher) Attached() bool {
	if a.closed() {
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

// AttachedTo reports whether the attachment on ifindex is healthy and the
// agent is open (xdp_attached).
func (a *Attacher) AttachedTo(ifindex int) bool {
	if a.closed() {
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
func (a *Attacher) check(att *Attachment) string {
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
		return fmt.Sprintf("the interface runs another XDP program (%s), not the agent's (id %d)", pin.DescribeProgram(x.ProgId), a.progID)
	}
	return ""
}
