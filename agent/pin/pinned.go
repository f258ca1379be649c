package pin

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
)

// PinnedLink is one interface's pinned limiter link.
type PinnedLink struct {
	// Iface is the name the link is pinned under: the interface's name
	// when it was attached (a rename is followed by the next agent or
	// detach).
	Iface   string `json:"iface"`
	Ifindex int    `json:"ifindex"`
	// Mode is native, generic, or "none" when the interface is gone.
	Mode      string `json:"mode"`
	LinkID    uint32 `json:"link_id"`
	ProgramID uint32 `json:"program_id"`
	// Gone is true when the interface was deleted: the kernel reports the
	// link's ifindex as 0. The link still holds the program and the maps
	// until it is detached.
	Gone bool `json:"interface_gone"`
}

// Pinned is the pinned state but the maps' content, read with no agent
// running.
type Pinned struct {
	PinPath string       `json:"pin_path"`
	Links   []PinnedLink `json:"interfaces"`
	// Layout is the pinned maps' layout record; an older layout than
	// bpf.Layout is read as far as it means what this one does, and
	// Unread names the maps that could not be.
	Layout Layout   `json:"layout"`
	Unread []string `json:"unread_maps,omitempty"`
}

// Read reads the links pinned under pin and opens its maps, of this
// layout or an older one; the caller closes lim. Returns ErrNotPinned when
// nothing is pinned there and *NewerLayoutError for a newer layout.
func Read(pin string) (_ Pinned, lim *bpf.Limiter, _ error) {
	st := Pinned{PinPath: pin}
	if c, err := CanonicalPinPath(pin); err == nil {
		pin = c
	}
	// A record that cannot be read (not root) is left to the Stat below,
	// which says so.
	var err error
	if st.Layout, err = CheckLayout(pin); errors.Is(err, ErrNewerLayout) {
		return st, nil, err
	}
	if _, err := os.Stat(filepath.Join(pin, "maps")); errors.Is(err, os.ErrNotExist) {
		return st, nil, fmt.Errorf("%w under %s", ErrNotPinned, pin)
	} else if err != nil {
		return st, nil, fmt.Errorf("read pinned state: %w (bpffs is usually root-only: run as root)", err)
	}
	entries, err := os.ReadDir(filepath.Join(pin, "links"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, nil, err
	}
	for _, e := range entries {
		pl, err := readPinnedLink(filepath.Join(pin, "links", e.Name()))
		if err != nil {
			return st, nil, err
		}
		pl.Iface = UnpinName(e.Name())
		st.Links = append(st.Links, pl)
	}
	lim, st.Unread, err = bpf.OpenPinned(filepath.Join(pin, "maps"), st.Layout.Version)
	return st, lim, err
}

func readPinnedLink(path string) (PinnedLink, error) {
	lk, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return PinnedLink{}, fmt.Errorf("open pinned link %s: %w", path, err)
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		return PinnedLink{}, fmt.Errorf("link info %s: %w", path, err)
	}
	pl := PinnedLink{LinkID: uint32(info.ID), ProgramID: uint32(info.Program), Mode: "unknown"}
	if x := info.XDP(); x != nil {
		pl.Ifindex = int(x.Ifindex)
		pl.Gone = x.Ifindex == 0
		if pl.Gone {
			pl.Mode = "none"
		} else if nh, err := netlink.NewHandle(); err == nil {
			// The mode as this network namespace sees ifindex: run
			// status in the namespace the agent ran in.
			pl.Mode = XDPModeOf(nh, pl.Ifindex)
			nh.Close()
		}
	}
	return pl, nil
}

// Detach removes the limiter from iface: the pinned link under pin (which
// detaches it) or, failing that, a tierlimit program attached through
// netlink. A link pinned under the interface's old name (it was renamed)
// is found by ifindex. Once no link is left, the pinned maps go too, and
// the window and the counters with them; so a pin directory with maps and
// no link (stale, or of an incompatible version) is removed as well.
//
// Returns *AgentRunningError while an agent runs with pin,
// *ForeignProgramError, touching nothing, when the program on iface is not
// tierlimit's, and ErrNotPinned when neither iface nor pin holds a limiter.
// Ownership is checked by the program pinned beside the links, so it
// works without CAP_SYS_ADMIN.
func Detach(pin, iface string) error {
	d, err := lockForDetach(pin)
	if err != nil {
		return err
	}
	defer d.Release(false)
	if nh, err := netlink.NewHandle(); err == nil {
		d.FollowRenames(nh, slog.New(slog.DiscardHandler))
		nh.Close()
	}
	linkPin := d.LinkPin(iface)
	lk, err := link.LoadPinnedLink(linkPin, nil)
	switch {
	case err == nil:
		defer lk.Close()
		info, err := lk.Info()
		if err != nil {
			return fmt.Errorf("link info %s: %w", linkPin, err)
		}
		if !d.owns(uint32(info.Program)) {
			return &ForeignProgramError{Iface: iface, Program: "pinned link " + linkPin + " runs " + DescribeProgram(uint32(info.Program))}
		}
		if err := lk.Unpin(); err != nil {
			return fmt.Errorf("unpin %s: %w", linkPin, err)
		}
	case errors.Is(err, os.ErrNotExist):
		err := detachNetlink(d, iface)
		if (errors.Is(err, ErrNotPinned) || errors.Is(err, ErrNoInterface)) && d.dirLock != nil && d.linksLeft() == 0 {
			break // nothing on iface: remove the stale maps below
		}
		if err != nil {
			return err
		}
	default:
		return fmt.Errorf("open pinned link %s: %w", linkPin, err)
	}
	return d.removeIfUnused()
}

// lockForDetach takes pin's locks, as a running agent holds them.
func lockForDetach(pin string) (*Dir, error) {
	path, err := CanonicalPinPath(pin)
	if err != nil {
		return nil, err
	}
	d := &Dir{path: path}
	// A running agent holds the lock: pulling its pins from under it
	// would leave it reporting a limiter that is gone.
	if d.runLock, err = lockRunFile(path); err != nil {
		return nil, err
	}
	if err := d.lockDir(false); err != nil {
		d.Release(false)
		return nil, err
	}
	return d, nil
}

// owns reports whether program id is tierlimit's: the program pinned
// beside the links (readable with CAP_BPF), or one named tierlimit
// (readable only with CAP_SYS_ADMIN; pin dirs of older versions).
func (d *Dir) owns(id uint32) bool {
	if p, err := ebpf.LoadPinnedProgram(d.Program(), nil); err == nil {
		info, ierr := p.Info()
		p.Close()
		if ierr == nil {
			if pid, ok := info.ID(); ok && uint32(pid) == id {
				return true
			}
		}
	}
	return ProgramNameOf(id) == ProgramName
}

// detachNetlink removes a tierlimit program attached without a link.
func detachNetlink(d *Dir, iface string) error {
	l, err := netlink.LinkByName(iface)
	if err != nil {
		return fmt.Errorf("interface %q: %w", iface, ErrNoInterface)
	}
	x := l.Attrs().Xdp
	if x == nil || !x.Attached {
		return fmt.Errorf("%w for %s", ErrNotPinned, iface)
	}
	if !d.owns(x.ProgId) {
		return &ForeignProgramError{Iface: iface, Program: DescribeProgram(x.ProgId)}
	}
	if err := netlink.LinkSetXdpFdWithFlags(l, -1, XDPModeFlags(x)); errors.Is(err, unix.EBUSY) {
		return &BusyError{Iface: iface, Program: DescribeProgram(x.ProgId)}
	} else if err != nil {
		return fmt.Errorf("detach xdp from %s: %w", iface, err)
	}
	return nil
}

func (d *Dir) linksLeft() int {
	entries, _ := os.ReadDir(d.Links())
	return len(entries)
}

// removeIfUnused removes the pin directory once no link is pinned in it.
func (d *Dir) removeIfUnused() error {
	if d.linksLeft() > 0 {
		return nil
	}
	if err := os.RemoveAll(d.path); err != nil {
		return fmt.Errorf("remove pinned maps %s: %w", d.path, err)
	}
	return nil
}

// XDPModeFlags are the flags that name x's attach mode to netlink, as a
// netlink detach needs them (native or generic; none for an offload or an
// unknown mode).
func XDPModeFlags(x *netlink.LinkXdp) int {
	switch x.AttachMode {
	case nl.XDP_ATTACHED_DRV:
		return nl.XDP_FLAGS_DRV_MODE
	case nl.XDP_ATTACHED_SKB:
		return nl.XDP_FLAGS_SKB_MODE
	}
	return 0
}
