package agent

import (
	"errors"
	"fmt"
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
	Iface     string `json:"iface"`
	Ifindex   int    `json:"ifindex"`
	Mode      string `json:"mode"`
	LinkID    uint32 `json:"link_id"`
	ProgramID uint32 `json:"program_id"`
}

// Status is the pinned state, read with no agent running.
type Status struct {
	PinPath string       `json:"pin_path"`
	Links   []PinnedLink `json:"interfaces"`
	Snapshot
}

// ReadStatus reads the links and maps pinned under pin. Returns
// ErrNotPinned when nothing is pinned there.
func ReadStatus(pin string) (Status, error) {
	st := Status{PinPath: pin}
	if _, err := os.Stat(filepath.Join(pin, "maps")); errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("%w under %s", ErrNotPinned, pin)
	} else if err != nil {
		return st, fmt.Errorf("read pinned state: %w (bpffs is usually root-only: run as root)", err)
	}
	entries, err := os.ReadDir(filepath.Join(pin, "links"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, err
	}
	for _, e := range entries {
		pl, err := readPinnedLink(filepath.Join(pin, "links", e.Name()))
		if err != nil {
			return st, err
		}
		pl.Iface = e.Name() // links are pinned by interface name
		st.Links = append(st.Links, pl)
	}
	lim, err := bpf.OpenPinned(filepath.Join(pin, "maps"))
	if err != nil {
		return st, err
	}
	defer lim.Close()
	st.Snapshot, err = TakeSnapshot(lim)
	return st, err
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
		// The mode as this network namespace sees ifindex: run status in
		// the namespace the agent ran in.
		if nh, err := netlink.NewHandle(); err == nil {
			pl.Mode = xdpModeOf(nh, pl.Ifindex)
			nh.Close()
		}
	}
	return pl, nil
}

// Detach removes the limiter from iface: the pinned link under pin (which
// detaches it) or, failing that, a tierlimit program attached through
// netlink. Once no interface is left, the pinned maps go too, and the
// window and the counters with them.
//
// Returns ErrAgentRunning while an agent runs with pin, ErrForeignProgram,
// touching nothing, when the program on iface is not tierlimit's, and
// ErrNotPinned when iface has no limiter.
func Detach(pin, iface string) error {
	// A running agent holds the lock: pulling its pins from under it
	// would leave it reporting a limiter that is gone.
	lock, err := lockPin(pin)
	if err != nil {
		return err
	}
	defer lock.unlock()
	linkPin := filepath.Join(pin, "links", iface)
	lk, err := link.LoadPinnedLink(linkPin, nil)
	switch {
	case err == nil:
		defer lk.Close()
		info, err := lk.Info()
		if err != nil {
			return fmt.Errorf("link info %s: %w", linkPin, err)
		}
		if name := programName(uint32(info.Program)); name != ProgramName {
			return fmt.Errorf("%w: pinned link %s runs program id %d, name %q", ErrForeignProgram, linkPin, info.Program, name)
		}
		if err := lk.Unpin(); err != nil {
			return fmt.Errorf("unpin %s: %w", linkPin, err)
		}
	case errors.Is(err, os.ErrNotExist):
		if err := detachNetlink(iface); err != nil {
			return err
		}
	default:
		return fmt.Errorf("open pinned link %s: %w", linkPin, err)
	}
	return removeIfUnused(pin)
}

// detachNetlink removes a tierlimit program attached without a link.
func detachNetlink(iface string) error {
	l, err := netlink.LinkByName(iface)
	if err != nil {
		return fmt.Errorf("interface %q: %w", iface, ErrNoInterface)
	}
	x := l.Attrs().Xdp
	if x == nil || !x.Attached {
		return fmt.Errorf("%w for %s", ErrNotPinned, iface)
	}
	if name := programName(x.ProgId); name != ProgramName {
		return fmt.Errorf("%w on %s: %s; tierlimit leaves it alone", ErrForeignProgram, iface, describeProgram(x.ProgId))
	}
	flags := 0
	switch x.AttachMode {
	case nl.XDP_ATTACHED_DRV:
		flags = nl.XDP_FLAGS_DRV_MODE
	case nl.XDP_ATTACHED_SKB:
		flags = nl.XDP_FLAGS_SKB_MODE
	}
	if err := netlink.LinkSetXdpFdWithFlags(l, -1, flags); errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%w: %w for %s here: its tierlimit (%s) is attached through a bpf_link pinned under another pin path, or held by a running agent",
			ErrNotPinned, ErrPinnedElsewhere, iface, describeProgram(x.ProgId))
	} else if err != nil {
		return fmt.Errorf("detach xdp from %s: %w", iface, err)
	}
	return nil
}

// removeIfUnused removes the pin directory once no link is pinned in it.
func removeIfUnused(pin string) error {
	entries, err := os.ReadDir(filepath.Join(pin, "links"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if len(entries) > 0 {
		return nil
	}
	if err := os.RemoveAll(pin); err != nil {
		return fmt.Errorf("remove pinned maps %s: %w", pin, err)
	}
	return nil
}

func programName(id uint32) string {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return ""
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Name
}
