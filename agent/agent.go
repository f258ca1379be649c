// Package agent runs tierlimit on a host: it loads the XDP limiter, writes
// the compiled policy into its maps, attaches it to interfaces through
// bpf_links, pins the links and maps under a bpffs directory so that
// limiting survives the agent, reloads policies atomically and exports the
// program's counters to Prometheus.
//
// It needs root, or CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN
// only to mount bpffs, CAP_DAC_OVERRIDE when not uid 0), and Linux >= 5.12;
// XDP links need >= 5.9 (older kernels fall back to netlink).
//
// The code lives in four rooms, one per kind of change; each file is
// listed under the room it belongs to (a feature's metrics family may sit
// with its feature, as collectAuto does in automax.go).
//
// Lifecycle and attach: starting, attaching, and stopping.
//   - agent.go: Config, Attachment, the Agent, New (resolve, load, apply,
//     attach), Limiter, Attachments and Close.
//   - attach.go: attaching to one interface, adopting a pinned link, the
//     netlink fallback, whether each interface still runs the limiter
//     (Attached, check), and letting go of it at Close (closeOne,
//     detachOne).
//   - netns.go: running in the agent's network namespace (inNS) and
//     opening the drop signal in another (OpenDropSourceIn);
//     stacked.go: refusing interfaces stacked on each other;
//     nativehint.go: what to change when a driver refuses native XDP;
//     gso.go: which interfaces count super-packets.
//   - caps.go: the capability check; errors.go: the typed errors.
//
// Pinned state and its repair: what outlives the agent.
//   - pindir.go and lock.go: the pin directory and its locks; bpffs.go:
//     refusing a bpffs that ends with the agent.
//   - linkwatch.go: Watch, which notices what changes under a running agent
//     (renamed, deleted or foreign interfaces, removed pins) and repairs it.
//   - pinned.go: reading and removing pinned state with no agent running
//     (tierlimit status and detach).
//
// Reload: changing the policy of a running agent.
//   - reload.go: Reload and ReloadContext, and the Reloader (SIGHUP, config
//     file changes) that calls them; configwatch.go: the config path's
//     symlink chain that the Reloader watches; configpoll.go: polling when
//     it cannot be watched, and the watch's metric.
//   - automax.go: the adaptive max's controller, which reads the drop signal
//     (sockdrops.go) and applies the law of tiers/autolaw.go.
//
// Metrics and serving: what the maps say, and who is told.
//   - snapshot.go: the Snapshot, one read of the maps, for /metrics and
//     status.
//   - metrics.go: the one collector and the limiter's families;
//     severity_metrics.go, sources.go and automax.go add their features'
//     families (collectSeverity, collectSources, collectAuto). sources.go
//     also logs groups going over budget (WatchSources).
//   - serve.go: the registry, the /metrics and /healthz handler, and the
//     HTTP server.
//   - the shed record (DESIGN.md §10): record.go reads the program's
//     samples, pcapng.go writes them, episode.go tracks and reports
//     episodes through syslog.go, and record_reload.go changes them all
//     on a reload.
package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// DefaultPinPath is where links and maps are pinned unless told otherwise.
const DefaultPinPath = "/sys/fs/bpf/tierlimit"

// ProgramName is the name of tierlimit's XDP program in the kernel.
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
	// Version is the binary's version, recorded beside the pinned
	// layout so that an older binary can name it.
	Version string
}

// Attachment is the limiter on one interface.
type Attachment struct {
	// Iface is the interface's name now: Watch follows renames.
	Iface string
	// Index is its ifindex in the agent's network namespace.
	Index int
	// Mode is what the kernel reports: native or generic.
	Mode string
	// LinkID is the bpf_link's id; 0 when attached through netlink.
	LinkID uint32

	link  link.Link
	flags int  // netlink attach flags, when link is nil
	lost  bool // Watch logged it as lost
	// deleted: the interface was deleted and its link dropped; Watch
	// attaches to the next interface of that name.
	deleted bool
}

// Agent is the running limiter.
type Agent struct {
	cfg Config
	log *slog.Logger
	lim *bpf.Limiter
	// progID is the id of lim's program: what health checks look for.
	progID uint32
	// nh is a netlink handle in the network namespace New ran in, so that
	// later calls from any goroutine see the same interfaces.
	nh *netlink.Handle
	// groups reads the multicast groups joined in that namespace (local.go).
	groups localGroups
	// ns is the network namespace New ran in (inNS).
	ns netns.NsHandle
	// pd is the pin directory, held while the agent runs; nil unpinned.
	pd *pinDir
	// migration carries an older layout's pinned state during New.
	migration *bpf.Migration

	// applyMu serialises reloads (Limiter.Apply) and Close; mu serialises
	// Watch's repairs and Close, and guards attached, so that /healthz
	// never waits for a reload.
	applyMu  sync.Mutex
	mu       sync.Mutex
	attached []*Attachment
	pinsLost bool // Watch logged the pinned state as gone

	auto   atomic.Pointer[AutoMax]  // the adaptive-max controller, once started
	record atomic.Pointer[Episodes] // the shed record, once started
	fleet  fleetState               // the fleet controller, once started (fleet.go)

	// current is the policy in force as given (its dests local
	// unresolved), and local the host's destinations it was resolved
	// with (local.go); both guarded by applyMu. stopLocal ends
	// followLocal.
	current   tiers.Policy
	local     []tiers.LocalDest
	stopLocal chan struct{}
	follow    localFollow // what following local counts (localfollow.go)
	// ifaces is what the program was last told of the attached
	// interfaces (host.go); guarded by mu.
	ifaces []bpf.Iface

	reloadOK, reloadErr atomic.Uint64
	configWatch         atomic.Int32 // a WatchMode, from the Reloader
	scrapeErrors        atomic.Uint64
	closed              atomic.Bool
}

// New loads the limiter (adopting pinned maps and links under
// cfg.PinPath if there are any), applies policy p and attaches to every
// interface. Pinned maps of an older layout, or whose specs differ, are
// migrated (DESIGN.md §11): the program is loaded on maps of its own, which
// get what keeps its meaning and the policy; the pinned links switch to it
// in place; then its maps are pinned in place of the old ones. The old
// program never sees the new policy: same-layout maps are shared, and a
// policy written into them is read alike by both programs, as on a reload. On error nothing stays attached that was not before, and a
// pin directory this call made is removed.
//
// Returns ErrNotRoot without the capabilities, ErrNoInterface for a missing
// interface, ErrDuplicateInterface for one given twice, *AgentRunningError when another agent holds cfg.PinPath,
// *NewerLayoutError for pinned state of a newer layout (nothing is
// written then), *ForeignProgramError when an interface runs another XDP
// program and cfg.Replace is false, *BusyError when it runs a tierlimit
// this agent cannot adopt, ErrNativeRefused, ErrPinPath, *PrivateBPFFSError
// when the bpffs at cfg.PinPath would end with the agent (nothing is
// attached then), *LinkTypeError (ErrNotEthernet) for an interface whose
// frames have no Ethernet header, ErrStacked when two
// interfaces are stacked on each other, and tiers errors for a policy that
// does not compile.
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
	if _, err := tiers.Compile(p); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, ns: netns.None(), stopLocal: make(chan struct{})}
	defer func() {
		if err != nil {
			a.abort()
		}
	}()
	links, err := a.resolve()
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		if err := checkEthernet(l); err != nil {
			return nil, err
		}
	}
	if err := checkStacked(a.nh, links); err != nil {
		return nil, err
	}
	// bpf(2) refused here, with the capabilities checked, is a filter:
	// say so before the memlock probe words it as a limit.
	if err := probeBPF(); errors.Is(err, unix.EPERM) {
		return nil, classifyBPFError(err, seccompMode())
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock rlimit: %w", err)
	}
	if err := a.load(); err != nil {
		return nil, err
	}
	if a.local, err = a.localDests(); err != nil {
		return nil, fmt.Errorf("read local addresses: %w", err)
	}
	a.follow.dests.Store(int64(len(a.local)))
	a.log.Debug("dests local: the host's destinations", "local", a.local)
	if err := a.applyLocked(p); err != nil {
		return nil, fmt.Errorf("apply policy: %w", err)
	}
	if a.pd != nil && a.pd.migrate != nil {
		if err := a.startMigration(); err != nil {
			return nil, err
		}
	}
	go a.followLocal(a.stopLocal, dupNS(a.ns))
	for i, l := range links {
		att, err := a.attach(l)
		if err != nil {
			return nil, fmt.Errorf("attach xdp to %s: %w", cfg.Interfaces[i], err)
		}
		a.attached = append(a.attached, att)
		a.log.Info("attached", "iface", att.Iface, "ifindex", att.Index, "mode", att.Mode, "link_id", att.LinkID, "program_id", a.progID)
	}
	if err := a.countSuperPackets(); err != nil {
		return nil, err
	}
	if err := a.describeIfaces(); err != nil {
		return nil, fmt.Errorf("describe interfaces to the program: %w", err)
	}
	go a.followIfaces(a.stopLocal, dupNS(a.ns))
	if a.pd != nil {
		if err := a.pinState(); err != nil {
			return nil, err
		}
		a.warnOtherLinks()
	}
	return a, nil
}

// pinState pins what New made under the pin directory once every link
// runs the program: the migrated maps, the program and the layout record.
func (a *Agent) pinState() error {
	if a.migration != nil {
		if err := a.finishMigration(); err != nil {
			return err
		}
	}
	if err := a.pd.pinProgram(a.lim.Program()); err != nil {
		return err
	}
	return writeLayout(a.pd.path, a.cfg.Version)
}

// resolve opens the netlink handle and looks the interfaces up.
func (a *Agent) resolve() ([]netlink.Link, error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("read network namespace: %w", err)
	}
	a.ns = ns
	nh, err := netlink.NewHandle() // in ns: NewHandleAt would need CAP_SYS_ADMIN
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	a.nh = nh
	links := make([]netlink.Link, len(a.cfg.Interfaces))
	seen := map[int]string{}
	for i, name := range a.cfg.Interfaces {
		if links[i], err = nh.LinkByName(name); err != nil {
			return nil, fmt.Errorf("interface %q: %w", name, ErrNoInterface)
		}
		idx := links[i].Attrs().Index
		if prev, dup := seen[idx]; dup {
			return nil, fmt.Errorf("%w: %q and %q are ifindex %d", ErrDuplicateInterface, prev, name, idx)
		}
		seen[idx] = name
	}
	return links, nil
}

// load takes the pin directory, when pinning, and loads the limiter into
// it: pinned maps are reused.
func (a *Agent) load() error {
	tick, terr := bpf.MeasureTick()
	if terr != nil {
		a.log.Warn("kernel tick unknown: every selected packet reads the clock", "reason", terr)
	} else if !tick.ConfigAgrees() {
		a.log.Warn("the kernel config's CONFIG_HZ is not the kernel's tick: using the measured tick",
			"config", tick.ConfigPath, "config_hz", tick.ConfigHZ, "measured_hz", fmt.Sprintf("%.2f", tick.HZ), "tick_ns", tick.Ns)
	}
	opts := bpf.Options{TickNs: tick.Ns}
	if a.cfg.PinPath != "" {
		pd, err := openPinDir(a.cfg.PinPath)
		if err != nil {
			return err
		}
		a.pd = pd
		a.logBPFFS()
		opts.PinPath = pd.maps()
		if pd.migrate != nil {
			opts.PinPath = "" // maps of its own, pinned once the links run it
		}
		followRenames(pd, a.nh, a.log)
	}
	lim, err := bpf.Load(opts)
	if err != nil {
		return err
	}
	a.lim = lim
	info, err := lim.Program().Info()
	if err != nil {
		return fmt.Errorf("program info: %w", err)
	}
	id, _ := info.ID()
	a.progID = uint32(id)
	return nil
}

// abort undoes a failed New: detaches what it attached unless pinned.
func (a *Agent) abort() {
	// Ends followLocal and followIfaces, which may have started.
	a.closed.Store(true)
	close(a.stopLocal)
	for _, att := range a.attached {
		if a.pd == nil {
			a.detachOne(att)
		} else if att.link != nil {
			att.link.Close()
		}
	}
	if a.migration != nil {
		a.migration.Close()
	}
	if a.lim != nil {
		a.lim.Close()
	}
	if a.nh != nil {
		a.nh.Close()
	}
	a.closeGroups()
	a.ns.Close()
	a.pd.release(true)
}

// Limiter is the loaded program and maps.
func (a *Agent) Limiter() *bpf.Limiter { return a.lim }

// Attachments lists the interfaces the limiter is attached to.
func (a *Agent) Attachments() []Attachment {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Attachment, len(a.attached))
	for i, att := range a.attached {
		out[i] = Attachment{Iface: att.Iface, Index: att.Index, Mode: att.Mode, LinkID: att.LinkID}
	}
	return out
}

// Close stops the agent. Without pinning it detaches the limiter; with
// pinning the limiter stays attached and counting. Either way the log says
// what is really left on each interface, checked with the kernel.
func (a *Agent) Close() error {
	if a.closed.Swap(true) {
		return nil
	}
	close(a.stopLocal)
	a.stopFleet() // leaves the fleet; before applyMu, which its loop may wait for
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, att := range a.attached {
		a.closeOne(att)
	}
	a.nh.Close()
	a.closeGroups()
	a.ns.Close()
	err := a.lim.Close()
	a.pd.release(false)
	return err
}
