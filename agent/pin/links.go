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
)

// ProgramName is the name of tierlimit's XDP program in the kernel.
const ProgramName = "tierlimit"

// AdoptLink opens the link pinned at path if it is an XDP link on ifindex.
// The pin of a link whose interface is gone (the kernel reports ifindex 0)
// is removed; a link on another interface is an error.
func AdoptLink(path string, ifindex int) (link.Link, error) {
	lk, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned link %s: %w", path, err)
	}
	info, err := lk.Info()
	if err != nil || info.XDP() == nil {
		lk.Close()
		return nil, fmt.Errorf("pinned link %s is not an XDP link (%v)", path, err)
	}
	switch int(info.XDP().Ifindex) {
	case ifindex:
		return lk, nil
	case 0:
		_ = lk.Unpin()
		lk.Close()
		return nil, nil
	}
	lk.Close()
	return nil, fmt.Errorf("%w: pinned link %s limits ifindex %d, not %d", ErrInterfaceBusy, path, info.XDP().Ifindex, ifindex)
}

// FollowRenames moves the pin of each link whose interface was renamed to
// the interface's new name: a link pinned under name A whose ifindex now
// carries name B, running the link's program, is the same interface.
func (d *Dir) FollowRenames(nh *netlink.Handle, log *slog.Logger) {
	entries, _ := os.ReadDir(d.Links())
	for _, e := range entries {
		path := filepath.Join(d.Links(), e.Name())
		lk, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			continue
		}
		info, err := lk.Info()
		lk.Close()
		if err != nil || info.XDP() == nil || info.XDP().Ifindex == 0 {
			continue
		}
		dev, err := nh.LinkByIndex(int(info.XDP().Ifindex))
		if err != nil {
			continue
		}
		old, now := UnpinName(e.Name()), dev.Attrs().Name
		x := dev.Attrs().Xdp
		if now == old || x == nil || x.ProgId != uint32(info.Program) {
			continue
		}
		if _, err := os.Stat(d.LinkPin(now)); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := os.Rename(path, d.LinkPin(now)); err == nil {
			log.Warn("interface was renamed: its pinned link follows", "from", old, "to", now, "ifindex", dev.Attrs().Index)
		}
	}
}

// XDPModeOf is the attach mode the kernel reports for ifindex.
func XDPModeOf(nh *netlink.Handle, ifindex int) string {
	l, err := nh.LinkByIndex(ifindex)
	if err != nil || l.Attrs().Xdp == nil {
		return "unknown"
	}
	switch l.Attrs().Xdp.AttachMode {
	case nl.XDP_ATTACHED_DRV:
		return "native"
	case nl.XDP_ATTACHED_SKB:
		return "generic"
	case nl.XDP_ATTACHED_HW:
		return "offload"
	}
	return "unknown"
}

// DescribeProgram names an attached program for error messages. The name
// needs CAP_SYS_ADMIN (BPF_PROG_GET_FD_BY_ID); without it only the id shows.
func DescribeProgram(id uint32) string {
	if name := ProgramNameOf(id); name != "" {
		return fmt.Sprintf("program id %d, name %q", id, name)
	}
	return fmt.Sprintf("program id %d", id)
}

// ProgramNameOf is the name of program id, "" when it cannot be read.
func ProgramNameOf(id uint32) string {
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
