package pin

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// Removed is what DetachAll removed.
type Removed struct {
	// Links are the bpf_links DetachAll detached from an interface.
	Links []RemovedLink
	// Netlink names the interfaces whose tierlimit program, attached
	// without a link, DetachAll removed.
	Netlink []string
	// PinDirs are the pin directories it removed, with their maps and
	// the pins of their links.
	PinDirs []string
}

// RemovedLink is one link DetachAll detached.
type RemovedLink struct {
	Iface     string
	LinkID    uint32
	ProgramID uint32
}

// RecordedPinPaths lists the pin paths that agents, status and detach
// have locked since boot: each lock file under LockDir records its pin
// path after the holder's pid. Lock files of versions that recorded no
// path are skipped.
func RecordedPinPaths() []string {
	entries, err := os.ReadDir(LockDir)
	if err != nil {
		return nil
	}
	var pins []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".lock") {
			continue
		}
		if pin := recordedPin(filepath.Join(LockDir, e.Name())); pin != "" && !slices.Contains(pins, pin) {
			pins = append(pins, pin)
		}
	}
	return pins
}

// recordedPin is the pin path on lock file path's second line, or "".
func recordedPin(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 0; sc.Scan(); i++ {
		if i == 1 && filepath.IsAbs(sc.Text()) {
			return sc.Text()
		}
	}
	return ""
}

// DetachAll removes tierlimit from every interface of the caller's network
// namespace, whoever attached it and wherever it is pinned, and removes the
// pin directories pins name (RecordedPinPaths and the default, for the
// package's removal):
//   - every XDP bpf_link whose program is tierlimit's (its name, or the
//     program pinned in one of pins) and whose interface is in this
//     namespace is detached with BPF_LINK_DETACH, which works whatever
//     holds the link: a pin under a path nobody recorded, an interface
//     left out of TIERLIMIT_IFACES since. `ip link set IF xdp off` cannot
//     remove a link's program (EBUSY).
//   - a tierlimit program attached through netlink is removed that way.
//   - each of pins that is a tierlimit pin directory is removed: its maps,
//     and the pins of links whose interface is gone or elsewhere.
//
// Links in other network namespaces are left alone, so that a test's
// namespace or a container's never loses its limiter to the host's
// removal. Returns *AgentRunningError, touching nothing, when an agent
// runs with one of pins. It goes on past a failure and returns the first.
func DetachAll(pins []string) (Removed, error) { return detachAll(pins, true) }

// Left is what DetachPinPath left in place.
type Left struct {
	// Ifaces are the interfaces of this namespace that still run a
	// tierlimit program: another pin path's, or one nobody recorded.
	Ifaces []string
	// PinDirs are the pin directories, of the others given, that still
	// hold pinned state.
	PinDirs []string
}

// DetachPinPath is `detach --all` of one pin path: it removes only what
// the agent of pinPath recorded there, from every interface of the
// caller's network namespace: the links pinned under pinPath and every
// other attachment (a link, netlink) of the program pinned there or run
// by those links, then the pin directory. Another pin path's limiter is
// left alone; Left names the interfaces that still run tierlimit and
// which of others still hold pinned state. Returns *AgentRunningError,
// touching nothing, when an agent runs with pinPath.
func DetachPinPath(pinPath string, others []string) (Removed, Left, error) {
	rm, err := detachAll([]string{pinPath}, false)
	var left Left
	if nh, nerr := netlink.NewHandle(); nerr == nil {
		if links, lerr := nh.LinkList(); lerr == nil {
			for _, l := range links {
				if x := l.Attrs().Xdp; x != nil && x.Attached && x.ProgId != 0 && ProgramNameOf(x.ProgId) == ProgramName {
					left.Ifaces = append(left.Ifaces, l.Attrs().Name)
				}
			}
		}
		nh.Close()
	}
	mine, _ := CanonicalPinPath(pinPath)
	for _, o := range others {
		c, cerr := CanonicalPinPath(o)
		if cerr != nil || c == mine || slices.Contains(left.PinDirs, c) || !isPinDir(c) {
			continue
		}
		left.PinDirs = append(left.PinDirs, c)
	}
	return rm, left, err
}

// detachAll is DetachAll; without everything, only the programs of pins
// count as ours, not every program named tierlimit's.
func detachAll(pins []string, everything bool) (Removed, error) {
	var rm Removed
	dirs, err := lockPinDirs(pins)
	defer func() {
		for _, d := range dirs {
			d.Release(false)
		}
	}()
	if err != nil {
		return rm, err
	}
	nh, err := netlink.NewHandle()
	if err != nil {
		return rm, fmt.Errorf("netlink: %w", err)
	}
	defer nh.Close()
	var progs []uint32 // the programs pinned in dirs, and run by their pinned links
	for _, d := range dirs {
		progs = append(progs, d.pinnedProgram())
		progs = append(progs, d.linkPrograms()...)
	}
	ours := func(id uint32) bool {
		return id != 0 && slices.Contains(progs, id) || everything && ProgramNameOf(id) == ProgramName
	}
	var errs []error
	rm.Links, errs = detachLinks(nh, ours)
	byNetlink, nerrs := detachNetlinkAll(nh, ours)
	rm.Netlink, errs = byNetlink, append(errs, nerrs...)
	for _, d := range dirs {
		if err := os.RemoveAll(d.path); err != nil {
			errs = append(errs, fmt.Errorf("remove pin dir %s: %w", d.path, err))
			continue
		}
		rm.PinDirs = append(rm.PinDirs, d.path)
	}
	if len(errs) > 0 {
		return rm, errs[0]
	}
	return rm, nil
}

// lockPinDirs locks each of pins that holds a tierlimit pin directory (a
// maps or links directory, or a layout record), as Detach does; the
// others are skipped. On *AgentRunningError it returns what it locked so
// far, for the caller to release.
func lockPinDirs(pins []string) ([]*Dir, error) {
	var dirs []*Dir
	seen := map[string]bool{}
	for _, pin := range pins {
		c, err := CanonicalPinPath(pin)
		if err != nil || seen[c] || !isPinDir(c) {
			continue
		}
		seen[c] = true
		d, err := lockForDetach(c)
		if err != nil {
			return dirs, err
		}
		dirs = append(dirs, d)
	}
	return dirs, nil
}

// isPinDir reports whether dir looks like a tierlimit pin directory.
func isPinDir(dir string) bool {
	for _, name := range []string{"maps", "links", layoutName} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}

// pinnedProgram is the id of the program pinned in d, or 0.
func (d *Dir) pinnedProgram() uint32 {
	p, err := ebpf.LoadPinnedProgram(d.Program(), nil)
	if err != nil {
		return 0
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return 0
	}
	id, _ := info.ID()
	return uint32(id)
}

// linkPrograms are the ids of the programs the links pinned in d run.
func (d *Dir) linkPrograms() []uint32 {
	ents, err := os.ReadDir(d.Links())
	if err != nil {
		return nil
	}
	var ids []uint32
	for _, e := range ents {
		l, err := link.LoadPinnedLink(filepath.Join(d.Links(), e.Name()), nil)
		if err != nil {
			continue
		}
		if info, err := l.Info(); err == nil {
			ids = append(ids, uint32(info.Program))
		}
		l.Close()
	}
	return ids
}

// detachLinks detaches every XDP link of this namespace whose program is
// ours. A link's ifindex is taken as this namespace's when the interface
// of that index here runs the link's program.
func detachLinks(nh *netlink.Handle, ours func(uint32) bool) ([]RemovedLink, []error) {
	var out []RemovedLink
	var errs []error
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil || info.Type != link.XDPType {
			continue
		}
		x := info.XDP()
		prog := uint32(info.Program)
		if x == nil || x.Ifindex == 0 || !ours(prog) {
			continue
		}
		l, err := nh.LinkByIndex(int(x.Ifindex))
		if err != nil || !runsProgram(l, prog) {
			continue // another namespace's interface
		}
		if err := it.Link.Detach(); err != nil {
			errs = append(errs, fmt.Errorf("detach link %d from %s: %w", it.ID, l.Attrs().Name, err))
			continue
		}
		out = append(out, RemovedLink{Iface: l.Attrs().Name, LinkID: uint32(it.ID), ProgramID: prog})
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list bpf links: %w", err))
	}
	return out, errs
}

// xdpAttachedMulti is IFLA_XDP_ATTACHED's XDP_ATTACHED_MULTI (if_link.h).
const xdpAttachedMulti = 4

// runsProgram reports whether l runs XDP program id (or, attached in both
// modes at once, may: the kernel then reports no single id).
func runsProgram(l netlink.Link, id uint32) bool {
	x := l.Attrs().Xdp
	return x != nil && x.Attached && (x.ProgId == id || x.AttachMode == xdpAttachedMulti)
}

// detachNetlinkAll removes our programs attached without a link from
// every interface of this namespace.
func detachNetlinkAll(nh *netlink.Handle, ours func(uint32) bool) ([]string, []error) {
	links, err := nh.LinkList()
	if err != nil {
		return nil, []error{fmt.Errorf("list interfaces: %w", err)}
	}
	var out []string
	var errs []error
	for _, l := range links {
		x := l.Attrs().Xdp
		if x == nil || !x.Attached || x.ProgId == 0 || !ours(x.ProgId) {
			continue
		}
		if err := netlink.LinkSetXdpFdWithFlags(l, -1, XDPModeFlags(x)); err != nil {
			errs = append(errs, fmt.Errorf("detach xdp from %s: %w", l.Attrs().Name, err))
			continue
		}
		out = append(out, l.Attrs().Name)
	}
	return out, errs
}
