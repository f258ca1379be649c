// Package agent runs tierlimit on a host: it loads the XDP limiter, writes
// the compiled policy into its maps, attaches it to interfaces through
// bpf_links, pins the links and maps under a bpffs directory so that
// limiting survives the agent, reloads policies atomically and exports the
// program's counters to Prometheus.
//
// It needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN to mount bpffs) and
// Linux >= 5.12; XDP links need >= 5.9 (older kernels fall back to netlink).
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// DefaultPinPath is where links and maps are pinned unless told otherwise.
const DefaultPinPath = "/sys/fs/bpf/tierlimit"

// ProgramName is the name of tierlimit's XDP program in the kernel, which
// is how a program is recognised as ours.
const ProgramName = "tierlimit"

// XDPMode is how the program is attached to an interface.
type XDPMode string

const (
	// XDPAuto tries native and falls back to generic, saying why.
	XDPAuto XDPMode = "auto"
	// XDPNative runs the program in the driver (XDP_FLAGS_DRV_MODE).
	XDPNative XDPMode = "native"
	// XDPGeneric runs it after the skb is built (XDP_FLAGS_SKB_MODE).
	XDPGeneric XDPMode = "generic"
)

// ParseXDPMode parses auto, native or generic. Returns ErrXDPMode otherwise.
func ParseXDPMode(s string) (XDPMode, error) {
	switch m := XDPMode(s); m {
	case XDPAuto, XDPNative, XDPGeneric:
		return m, nil
	}
	return "", fmt.Errorf("%w: %q (want auto, native or generic)", ErrXDPMode, s)
}

var (
	// ErrXDPMode is returned by ParseXDPMode for an unknown mode.
	ErrXDPMode = errors.New("unknown XDP mode")
	// ErrNoInterface is returned by New when an interface does not exist.
	ErrNoInterface = errors.New("no such interface")
	// ErrForeignProgram is returned by New and Detach when an interface
	// runs an XDP program that is not tierlimit's.
	ErrForeignProgram = errors.New("interface runs another XDP program")
	// ErrNotRoot is returned by New when the process lacks root.
	ErrNotRoot = errors.New("not running as root: loading and attaching XDP needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN")
	// ErrNotPinned is returned by Detach and Status when no pinned state exists.
	ErrNotPinned = errors.New("no pinned tierlimit state")
)

// Config configures an Agent.
type Config struct {
	// Interfaces to attach to, by name; at least one.
	Interfaces []string
	// XDPMode is auto, native or generic; empty means auto.
	XDPMode XDPMode
	// PinPath is the bpffs directory for links and maps. Empty disables
	// pinning: the limiter is detached when the agent closes.
	PinPath string
	// Replace allows replacing another XDP program on an interface.
	Replace bool
	// Logger receives the agent's logs; nil discards them.
	Logger *slog.Logger
}

// Attachment is the limiter on one interface.
type Attachment struct {
	Iface string
	Index int
	// Mode is what the kernel reports: native or generic.
	Mode string
	// link is the bpf_link; nil when attached through netlink.
	link  link.Link
	flags int
}

// Agent is the running limiter.
type Agent struct {
	cfg Config
	log *slog.Logger
	lim *bpf.Limiter
	// nh is a netlink handle in the network namespace New ran in, so that
	// later calls from any goroutine see the same interfaces.
	nh *netlink.Handle

	// mu serialises reloads (Limiter.Apply) and guards attached.
	mu       sync.Mutex
	attached []*Attachment

	lock *pinLock // held while the agent runs, when pinning

	reloadOK, reloadErr atomic.Uint64
	scrapeErrors        atomic.Uint64
	closed              atomic.Bool
}

// New loads the limiter (adopting pinned maps and links under
// cfg.PinPath if there are any), applies policy p and attaches to every
// interface. On error nothing stays attached that was not before.
//
// Returns ErrNotRoot without the capabilities, ErrNoInterface for a missing
// interface, ErrAgentRunning when another agent holds cfg.PinPath,
// ErrForeignProgram when an interface runs another XDP program and
// cfg.Replace is false, and tiers errors for a policy that does not compile.
func New(cfg Config, p tiers.Policy) (_ *Agent, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.XDPMode == "" {
		cfg.XDPMode = XDPAuto
	}
	if len(cfg.Interfaces) == 0 {
		return nil, fmt.Errorf("%w: no interface given", ErrNoInterface)
	}
	if err := checkCaps(); err != nil {
		return nil, err
	}
	tab, err := tiers.Compile(p)
	if err != nil {
		return nil, err
	}
	nh, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	// Until a is built, close nh on error; from then on a.abort does.
	var a *Agent
	defer func() {
		if err != nil && a == nil {
			nh.Close()
		}
	}()
	links := make([]netlink.Link, len(cfg.Interfaces))
	for i, name := range cfg.Interfaces {
		if links[i], err = nh.LinkByName(name); err != nil {
			return nil, fmt.Errorf("interface %q: %w", name, ErrNoInterface)
		}
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock rlimit: %w", err)
	}

	tick, terr := bpf.KernelTick()
	if terr != nil {
		cfg.Logger.Warn("kernel tick unknown: every selected packet reads the clock", "reason", terr)
	}
	opts := bpf.Options{TickNs: tick}
	// dir is where this run pins: cfg.PinPath itself when adopting, else a
	// temporary sibling renamed into place at the end.
	var (
		lock *pinLock
		dir  string
	)
	if cfg.PinPath != "" {
		if strings.Contains(filepath.Base(cfg.PinPath), ".") {
			return nil, fmt.Errorf("pin path %s: bpffs refuses names with a dot", cfg.PinPath)
		}
		// Taken before anything reads or writes the pinned state, so that
		// a second agent can change nothing of a running one's.
		if lock, err = lockPin(cfg.PinPath); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				lock.unlock()
			}
		}()
		if err := ensureBPFFS(cfg.PinPath); err != nil {
			return nil, err
		}
		var commit func() error
		if dir, commit, err = preparePinDir(cfg.PinPath); err != nil {
			return nil, err
		}
		opts.PinPath = filepath.Join(dir, "maps")
		defer func() {
			if err == nil {
				err = commit()
			} else {
				cleanupTmp(dir, cfg.PinPath)
			}
		}()
	}
	lim, err := bpf.Load(opts)
	if err != nil {
		if cfg.PinPath != "" {
			return nil, fmt.Errorf("%w (the maps pinned under %s may be from an incompatible version: tierlimit detach removes them)", err, cfg.PinPath)
		}
		return nil, err
	}
	a = &Agent{cfg: cfg, log: cfg.Logger, nh: nh, lim: lim, lock: lock}
	defer func() {
		if err != nil {
			a.abort()
		}
	}()
	if err := a.lim.Apply(p, tab); err != nil {
		return nil, fmt.Errorf("apply policy: %w", err)
	}
	for i, l := range links {
		att, err := a.attach(l, dir)
		if err != nil {
			return nil, fmt.Errorf("attach xdp to %s: %w", cfg.Interfaces[i], err)
		}
		a.attached = append(a.attached, att)
		a.log.Info("attached", "iface", att.Iface, "ifindex", att.Index, "mode", att.Mode)
	}
	if dir != "" {
		a.warnOtherLinks(dir)
	}
	return a, nil
}

// warnOtherLinks logs the interfaces that a pinned link from an earlier run
// still limits although this run was not asked to: they share this run's
// maps and policy, and only tierlimit detach removes them.
func (a *Agent) warnOtherLinks(dir string) {
	entries, _ := os.ReadDir(filepath.Join(dir, "links"))
	for _, e := range entries {
		mine := false
		for _, att := range a.attached {
			mine = mine || att.Iface == e.Name()
		}
		if !mine {
			a.log.Warn("interface still limited by a pinned link from an earlier run", "iface", e.Name(),
				"remove_with", "tierlimit detach --iface "+e.Name()+" --pin-path "+a.cfg.PinPath)
		}
	}
}

// abort undoes a failed New: detaches what it attached unless pinned.
func (a *Agent) abort() {
	for _, att := range a.attached {
		if a.cfg.PinPath == "" {
			a.detachOne(att)
		} else if att.link != nil {
			att.link.Close()
		}
	}
	if a.lim != nil {
		a.lim.Close()
	}
	a.nh.Close()
}

// Limiter is the loaded program and maps.
func (a *Agent) Limiter() *bpf.Limiter { return a.lim }

// Attachments lists the interfaces the limiter is attached to.
func (a *Agent) Attachments() []Attachment {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Attachment, len(a.attached))
	for i, att := range a.attached {
		out[i] = Attachment{Iface: att.Iface, Index: att.Index, Mode: att.Mode}
	}
	return out
}

// Attached reports whether the limiter is attached to every interface.
func (a *Agent) Attached() bool {
	atts := a.Attachments()
	if len(atts) == 0 {
		return false
	}
	for _, att := range atts {
		if !a.attachedTo(att.Index) {
			return false
		}
	}
	return true
}

// attachedTo reports whether ifindex runs an XDP program and the agent is open.
func (a *Agent) attachedTo(ifindex int) bool {
	return !a.closed.Load() && a.xdpOn(ifindex)
}

// xdpOn reports whether ifindex runs an XDP program.
func (a *Agent) xdpOn(ifindex int) bool {
	l, err := a.nh.LinkByIndex(ifindex)
	return err == nil && l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
}

// Watch logs, every interval until ctx ends, when an interface loses the
// limiter (the interface was deleted, or someone detached it) or gets it
// back: /healthz and xdp_attached show it too, but an operator reads logs.
func (a *Agent) Watch(ctx context.Context, interval time.Duration) {
	up := map[string]bool{}
	for _, att := range a.Attachments() {
		up[att.Iface] = true
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, att := range a.Attachments() {
			now := a.attachedTo(att.Index)
			if now == up[att.Iface] || ctx.Err() != nil {
				continue
			}
			up[att.Iface] = now
			if now {
				a.log.Info("limiter attached again", "iface", att.Iface)
			} else {
				a.log.Error("limiter no longer attached: interface gone or program detached", "iface", att.Iface, "ifindex", att.Index)
			}
		}
	}
}

// Reload compiles p and swaps it in atomically (bpf.Limiter.Apply). On
// error the old policy keeps running, and the error is counted in
// config_reloads_total{result="error"}.
func (a *Agent) Reload(p tiers.Policy) error {
	err := a.reload(p)
	if err != nil {
		a.reloadErr.Add(1)
		return err
	}
	a.reloadOK.Add(1)
	return nil
}

// ReloadFailed counts a reload that failed before a policy existed (the
// config file did not parse).
func (a *Agent) ReloadFailed() { a.reloadErr.Add(1) }

func (a *Agent) reload(p tiers.Policy) error {
	tab, err := tiers.Compile(p) // validates p
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lim.Apply(p, tab)
}

// Close stops the agent. Without pinning it detaches the limiter; with
// pinning the limiter stays attached and counting, and the log says how to
// remove it.
func (a *Agent) Close() error {
	if a.closed.Swap(true) {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, att := range a.attached {
		if a.cfg.PinPath == "" {
			a.detachOne(att)
			a.log.Info("detached", "iface", att.Iface)
			continue
		}
		gone := !a.xdpOn(att.Index)
		if att.link != nil {
			att.link.Close()
		}
		if gone {
			a.log.Warn("interface no longer runs the limiter", "iface", att.Iface)
			continue
		}
		remove := "tierlimit detach --iface " + att.Iface
		if a.cfg.PinPath != DefaultPinPath {
			remove += " --pin-path " + a.cfg.PinPath
		}
		a.log.Info("limiter stays attached and pinned", "iface", att.Iface, "pin", a.cfg.PinPath, "remove_with", remove)
	}
	a.nh.Close()
	err := a.lim.Close()
	a.lock.unlock()
	return err
}

func (a *Agent) detachOne(att *Attachment) {
	if att.link != nil {
		if err := att.link.Close(); err != nil {
			a.log.Warn("detach", "iface", att.Iface, "error", err)
		}
		return
	}
	if l, err := a.nh.LinkByIndex(att.Index); err == nil {
		_ = netlink.LinkSetXdpFdWithFlags(l, -1, att.flags)
	}
}

// attach attaches the program to l, or adopts the link pinned for it and
// updates its program in place, so the interface is never without XDP.
func (a *Agent) attach(l netlink.Link, pin string) (*Attachment, error) {
	name, idx := l.Attrs().Name, l.Attrs().Index
	att := &Attachment{Iface: name, Index: idx}
	prog := a.lim.Program()
	var linkPin string
	// restore is the mode the interface ran in before a mode switch: if the
	// new mode is refused, the limiter goes back on in that one.
	var restore XDPMode
	if pin != "" {
		linkPin = filepath.Join(pin, "links", name)
		lk, err := adoptLink(linkPin, idx)
		if err != nil {
			return nil, err
		}
		if lk != nil {
			cur := xdpModeOf(a.nh, idx)
			if want := string(a.cfg.XDPMode); a.cfg.XDPMode != XDPAuto && want != cur {
				// A link cannot change mode: detach and attach anew.
				a.log.Warn("switching XDP mode: the interface is without the limiter for a moment",
					"iface", name, "from", cur, "to", want)
				_ = lk.Unpin()
				lk.Close()
				restore = XDPMode(cur)
				if l, err = a.nh.LinkByIndex(idx); err != nil {
					return nil, err
				}
			} else {
				if err := lk.Update(prog); err != nil {
					lk.Close()
					return nil, fmt.Errorf("update pinned link %s: %w", linkPin, err)
				}
				att.link, att.Mode = lk, cur
				a.log.Info("adopted pinned link, program replaced in place", "iface", name, "pin", linkPin)
				return att, nil
			}
		}
	}

	if x := l.Attrs().Xdp; x != nil && x.Attached {
		owner := describeProgram(x.ProgId)
		if programName(x.ProgId) == ProgramName {
			return nil, fmt.Errorf("%s already runs tierlimit (%s), attached by another agent or pinned under another --pin-path: "+
				"use that pin path, or remove it with tierlimit detach --iface %s [--pin-path P]", name, owner, name)
		}
		if !a.cfg.Replace {
			return nil, fmt.Errorf("%w: %s (pass --replace to replace it)", ErrForeignProgram, owner)
		}
		a.log.Warn("replacing XDP program", "iface", name, "program", owner)
		for _, f := range []int{nl.XDP_FLAGS_DRV_MODE, nl.XDP_FLAGS_SKB_MODE} {
			_ = netlink.LinkSetXdpFdWithFlags(l, -1, f)
		}
		if l, err := a.nh.LinkByIndex(idx); err == nil && l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached {
			return nil, fmt.Errorf("%w: %s is held by a bpf_link, which only its owner can remove", ErrForeignProgram, owner)
		}
	}

	try := func(mode XDPMode) error {
		flags, lflags := nl.XDP_FLAGS_DRV_MODE, link.XDPDriverMode
		if mode == XDPGeneric {
			flags, lflags = nl.XDP_FLAGS_SKB_MODE, link.XDPGenericMode
		}
		lk, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx, Flags: lflags})
		if errors.Is(err, ebpf.ErrNotSupported) {
			// No XDP bpf_link (kernel < 5.9): attach through netlink.
			a.log.Warn("no XDP bpf_link support, attaching through netlink (not pinnable)", "iface", name)
			if err := netlink.LinkSetXdpFdWithFlags(l, prog.FD(), flags|nl.XDP_FLAGS_UPDATE_IF_NOEXIST); err != nil {
				return err
			}
			att.flags = flags
			return nil
		}
		if err != nil {
			return err
		}
		att.link = lk
		return nil
	}
	var err error
	switch a.cfg.XDPMode {
	case XDPAuto:
		if err = try(XDPNative); err != nil {
			a.log.Warn("native XDP refused, falling back to generic", "iface", name, "reason", err,
				"hint", nativeHint("/sys/class/net", name, err))
			err = try(XDPGeneric)
		}
	default:
		err = try(a.cfg.XDPMode)
	}
	if err != nil {
		if a.cfg.XDPMode == XDPNative {
			// bpf_link creation carries no extack: the errno is all the
			// kernel says. EOPNOTSUPP means the driver has no native XDP.
			err = fmt.Errorf("native mode refused by the driver: %w (try --xdp-mode generic, or auto to fall back)", err)
			if h := nativeHint("/sys/class/net", name, err); h != "" {
				err = fmt.Errorf("%w; %s", err, h)
			}
		} else {
			err = fmt.Errorf("%s mode: %w", a.cfg.XDPMode, err)
		}
		if restore == XDPNative || restore == XDPGeneric {
			if rerr := try(restore); rerr != nil {
				return nil, fmt.Errorf("%w; putting the limiter back in %s mode failed too: %v", err, restore, rerr)
			}
			if att.link != nil && linkPin != "" {
				if perr := att.link.Pin(linkPin); perr != nil {
					return nil, fmt.Errorf("%w; the limiter is back in %s mode but could not be pinned: %v", err, restore, perr)
				}
				att.link.Close() // pinned: it stays attached
			}
			return nil, fmt.Errorf("%w; the limiter stays attached in %s mode", err, restore)
		}
		return nil, err
	}
	att.Mode = xdpModeOf(a.nh, idx)
	if linkPin != "" && att.link != nil {
		if err := att.link.Pin(linkPin); err != nil {
			att.link.Close()
			return nil, fmt.Errorf("pin link: %w", err)
		}
	}
	return att, nil
}

// adoptLink opens the link pinned at path if it is an XDP link on ifindex.
// A stale pin (the interface was removed and made again) is removed.
func adoptLink(path string, ifindex int) (link.Link, error) {
	lk, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned link %s: %w", path, err)
	}
	info, err := lk.Info()
	if err == nil && info.XDP() != nil && int(info.XDP().Ifindex) == ifindex {
		return lk, nil
	}
	_ = lk.Unpin()
	lk.Close()
	return nil, nil
}

// xdpModeOf is the attach mode the kernel reports for ifindex.
func xdpModeOf(nh *netlink.Handle, ifindex int) string {
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

// describeProgram names an attached program for error messages.
func describeProgram(id uint32) string {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return fmt.Sprintf("program id %d", id)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.Name == "" {
		return fmt.Sprintf("program id %d", id)
	}
	return fmt.Sprintf("program id %d, name %q", id, info.Name)
}

// ensureBPFFS makes sure the pin path's parent is on a bpffs, mounting
// one on /sys/fs/bpf when it is missing there.
func ensureBPFFS(pin string) error {
	parent := filepath.Dir(pin)
	if isBPFFS(parent) {
		return nil
	}
	if parent != "/sys/fs/bpf" {
		return fmt.Errorf("pin path %s: %s is not a bpffs mount", pin, parent)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	if err := unix.Mount("bpf", parent, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("%s is not a bpffs mount and mounting one failed: %w (mount it with: mount -t bpf bpf /sys/fs/bpf)", parent, err)
	}
	return nil
}

func isBPFFS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}

// preparePinDir returns the directory to pin into. An existing pin
// directory is used as is (adoption). Otherwise a temporary sibling is
// made, and commit renames it into place once everything is pinned, so
// that a crash never leaves a half-made pin directory at pin.
func preparePinDir(pin string) (dir string, commit func() error, err error) {
	if _, err := os.Stat(pin); err == nil {
		for _, sub := range []string{"maps", "links"} {
			if err := os.MkdirAll(filepath.Join(pin, sub), 0o700); err != nil {
				return "", nil, err
			}
		}
		return pin, func() error { return nil }, nil
	}
	// bpffs refuses names with a dot.
	tmp := fmt.Sprintf("%s-tmp-%d-%d", pin, os.Getpid(), time.Now().UnixNano())
	for _, sub := range []string{"maps", "links"} {
		if err := os.MkdirAll(filepath.Join(tmp, sub), 0o700); err != nil {
			return "", nil, fmt.Errorf("make pin dir: %w", err)
		}
	}
	return tmp, func() error {
		if err := os.Rename(tmp, pin); err != nil {
			return fmt.Errorf("move pins into %s: %w", pin, err)
		}
		return nil
	}, nil
}

func cleanupTmp(dir, pin string) {
	if dir != pin {
		os.RemoveAll(dir)
	}
}
