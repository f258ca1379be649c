// Package attach is the limiter's place on the interfaces of one run: it
// resolves them (refusing an interface without Ethernet headers and
// interfaces stacked on each other), loads the program into the pin
// directory, attaches it through bpf_links (adopting pinned links, falling
// back to netlink where the kernel has no XDP links), keeps it attached
// (Watch), tells the program what it may check of each interface, and
// lets go of it at Close. It needs Linux >= 5.17, as the agent does.
//
// It is a room of the agent: it never imports package agent, which wires
// it (the policy, the local addresses and the rooms that read the maps
// stay there).
//   - attacher.go: Config, Attachment, the Attacher and its lifecycle
//     (Resolve, Load, AttachAll, PinState, Abort, Close);
//   - attach.go: attaching one interface (the linker) and checking that
//     it still runs the limiter; pins.go: the pins of one run;
//   - linkwatch.go: Watch, which repairs what changes under a running
//     agent; host.go, foreignchild.go and gso.go: what the program may
//     check of each interface (the host describer);
//   - stacked.go, nativehint.go, errors.go.
package attach

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sysutil"
)

// Config is what an Attacher needs of the agent's configuration.
type Config struct {
	// Interfaces to attach to, by name; at least one.
	Interfaces []string
	// XDPMode is auto, native or generic; empty means auto.
	XDPMode XDPMode
	// PinPath is the bpffs directory for links and maps. Empty disables
	// pinning: the limiter is detached at Close.
	PinPath string
	// Replace allows replacing another XDP program on an interface.
	Replace bool
	// Logger receives the logs; nil discards them.
	Logger *slog.Logger
	// Version is the binary's version, recorded beside the pinned layout.
	Version string
	// Closed reports whether the agent has closed: then the limiter is
	// not attached, and Watch and FollowIfaces stop repairing. Nil means
	// never.
	Closed func() bool
	// AfterRound, when set, runs after each Watch round, with no lock
	// of the Attacher held: the agent reads the host's destinations again,
	// so that an event lost in a storm is never lost for good.
	AfterRound func()
}

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

// env is what the parts of an Attacher share (the linker, the pins, the
// host describer); Resolve and Load fill it in.
type env struct {
	cfg Config
	log *slog.Logger
	lim *bpf.Limiter
	// progID is the id of lim's program: what health checks look for.
	progID uint32
	// nh is a netlink handle in the network namespace Resolve ran in, so
	// that later calls from any goroutine see the same interfaces.
	nh *netlink.Handle
	// ns is the network namespace Resolve ran in (inNS).
	ns netns.NsHandle
	// pd is the pin directory, held while the agent runs; nil unpinned.
	pd *pin.Dir
}

// Attacher is the limiter's place on the interfaces: it resolves them,
// loads the program into the pin directory, attaches it (adopting pinned
// links), keeps it attached (Watch), tells the program what it may check
// of each interface (host.go), and lets go of it at Close.
type Attacher struct {
	*env
	closed     func() bool
	afterRound func()
	link       *linker // attaches one interface (attach.go)
	pins       *pins   // the pins of the run (pins.go)
	host       *host   // what the program may check (host.go)

	// mu serialises Watch's repairs and Close, and guards attached, the
	// pins' state and the host's.
	mu       sync.Mutex
	attached []*Attachment
}

// New returns an Attacher for cfg; Resolve, Load and AttachAll then put
// the limiter on the interfaces.
func New(cfg Config) *Attacher {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.XDPMode == "" {
		cfg.XDPMode = XDPAuto
	}
	if cfg.Closed == nil {
		cfg.Closed = func() bool { return false }
	}
	e := &env{cfg: cfg, log: cfg.Logger, ns: netns.None()}
	p := &pins{env: e}
	return &Attacher{env: e, closed: cfg.Closed, afterRound: cfg.AfterRound,
		link: &linker{env: e, pins: p}, pins: p, host: &host{env: e}}
}

// PinState pins what the run made under the pin directory once every
// link runs the program: the migrated maps, the program and the layout
// record. Without pinning there is nothing to pin. It warns of the pinned
// links of interfaces this run was not given.
func (a *Attacher) PinState() error { return a.pins.finish(a.attached) }

// StartMigration carries an older layout's pinned state into the maps of
// the loaded program, once the policy is applied (pin.Dir.StartMigration);
// nothing when there is none.
func (a *Attacher) StartMigration() error { return a.pins.startMigration() }

// Resolve opens the netlink handle in the calling thread's network
// namespace, which is the agent's from then on, and looks the interfaces
// up. Returns pin.ErrNoInterface for a missing interface,
// ErrDuplicateInterface for one given twice, *LinkTypeError
// (ErrNotEthernet) for an interface whose frames have no Ethernet header,
// and ErrStacked when two of them are stacked on each other.
func (a *Attacher) Resolve() ([]netlink.Link, error) {
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
			return nil, fmt.Errorf("interface %q: %w", name, pin.ErrNoInterface)
		}
		idx := links[i].Attrs().Index
		if prev, dup := seen[idx]; dup {
			return nil, fmt.Errorf("%w: %q and %q are ifindex %d", ErrDuplicateInterface, prev, name, idx)
		}
		seen[idx] = name
	}
	for _, l := range links {
		if err := checkEthernet(l); err != nil {
			return nil, err
		}
	}
	if err := checkStacked(nh, links); err != nil {
		return nil, err
	}
	return links, nil
}

// Load takes the pin directory, when pinning, and loads the limiter into
// it: pinned maps are reused. Returns pin's errors for a pin directory
// that cannot be taken, and bpf's for a program that does not load.
func (a *Attacher) Load() (*bpf.Limiter, error) {
	tick, terr := bpf.MeasureTick()
	if terr != nil {
		a.log.Warn("kernel tick unknown: every selected packet reads the clock", "reason", terr)
	} else if !tick.ConfigAgrees() {
		a.log.Warn("the kernel config's CONFIG_HZ is not the kernel's tick: using the measured tick",
			"config", tick.ConfigPath, "config_hz", tick.ConfigHZ, "measured_hz", fmt.Sprintf("%.2f", tick.HZ), "tick_ns", tick.Ns)
	}
	opts := bpf.Options{TickNs: tick.Ns}
	if a.cfg.PinPath != "" {
		pd, err := pin.Open(a.cfg.PinPath)
		if err != nil {
			return nil, err
		}
		a.pd = pd
		pd.LogLife(a.log)
		opts.PinPath = pd.Maps()
		if pd.Migrate != nil {
			opts.PinPath = "" // maps of its own, pinned once the links run it
		}
		pd.FollowRenames(a.nh, a.log)
	}
	lim, err := bpf.Load(opts)
	if err != nil {
		return nil, err
	}
	a.lim = lim
	if a.pd != nil && a.pd.Migrate == nil {
		a.adoptSketch(lim)
	}
	info, err := lim.Program().Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	id, _ := info.ID()
	a.progID = uint32(id)
	return lim, nil
}

// AttachAll attaches to every interface of links (from Resolve) and tells
// the program what it may check of them. Returns *pin.ForeignProgramError
// when an interface runs another XDP program and Config.Replace is false,
// *pin.BusyError when it runs a tierlimit this run cannot adopt,
// ErrNativeRefused, and bpf.ErrSuperPackets wrapped for generic mode
// where the kernel cannot show a super-packet's segments.
func (a *Attacher) AttachAll(links []netlink.Link) error {
	for i, l := range links {
		att, err := a.link.attach(l)
		if err != nil {
			return fmt.Errorf("attach xdp to %s: %w", a.cfg.Interfaces[i], err)
		}
		a.attached = append(a.attached, att)
		a.log.Info("attached", "iface", att.Iface, "ifindex", att.Index, "mode", att.Mode, "link_id", att.LinkID, "program_id", a.progID)
	}
	if err := a.host.countSuperPackets(a.attached); err != nil {
		return err
	}
	if err := a.host.describe(a.attached); err != nil {
		return fmt.Errorf("describe interfaces to the program: %w", err)
	}
	return nil
}

// Abort undoes a failed start: detaches what it attached unless pinned,
// and closes the limiter, the handles and the pin directory (removed if
// this run made it).
func (a *Attacher) Abort() {
	for _, att := range a.attached {
		if a.pd == nil {
			a.detachOne(att)
		} else if att.link != nil {
			att.link.Close()
		}
	}
	a.pins.abort()
	if a.lim != nil {
		a.lim.Close()
	}
	if a.nh != nil {
		a.nh.Close()
	}
	a.ns.Close()
	a.pd.Release(true)
}

// Close lets go of every interface (closeOne) and closes the limiter, as
// the agent stops. Returns the limiter's close error.
func (a *Attacher) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, att := range a.attached {
		a.closeOne(att)
	}
	a.nh.Close()
	a.ns.Close()
	err := a.lim.Close()
	a.pd.Release(false)
	return err
}

// Attachments lists the interfaces the limiter is attached to.
func (a *Attacher) Attachments() []Attachment {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Attachment, len(a.attached))
	for i, att := range a.attached {
		out[i] = Attachment{Iface: att.Iface, Index: att.Index, Mode: att.Mode, LinkID: att.LinkID}
	}
	return out
}

// IfName is the name of the attached interface with ifindex i, or "".
func (a *Attacher) IfName(i int) string {
	for _, att := range a.Attachments() {
		if att.Index == i {
			return att.Iface
		}
	}
	return ""
}

// IfaceNames are the names of the attached interfaces.
func (a *Attacher) IfaceNames() []string {
	var out []string
	for _, att := range a.Attachments() {
		out = append(out, att.Iface)
	}
	return out
}

// Handle is the netlink handle in the agent's network namespace (from
// Resolve); Close closes it.
func (a *Attacher) Handle() *netlink.Handle { return a.nh }

// NS is the agent's network namespace (from Resolve); Close closes it.
func (a *Attacher) NS() netns.NsHandle { return a.ns }

// inNS runs fn on a locked OS thread in the agent's network namespace ns.
// Attaching XDP by ifindex (bpf_link_create, netlink's package handle)
// acts on the calling thread's namespace, and Watch may run on any
// goroutine: an ifindex of the agent's namespace must never reach another
// one's interface.
func inNS(ns netns.NsHandle, fn func() error) error {
	return sysutil.OnThreadIn(ns, "the agent's network namespace", fn)
}

// subscriptionErrors is a netlink subscription's error callback that logs
// msg with the error, except once done is closed: the subscription's
// socket is closed then (after done, by the netlink package), and its
// failed receive is the end asked for, not an error. A refused start
// closes done before it exits, and says one line.
func subscriptionErrors(log *slog.Logger, done <-chan struct{}, msg string) func(error) {
	return func(err error) {
		select {
		case <-done:
			return
		default:
		}
		log.Warn(msg, "err", err)
	}
}

// adoptSketch carries the source sketch of the program pinned in the pin
// directory, which lim's replaces on the links of a restart, into lim's
// (bpf.Limiter.AdoptSketch, from the globals pinned beside that program).
// Without it nothing is lost but the groups' counts of the open window
// (each group's budget once more in it): a warning when there was a
// sketch to carry.
func (a *Attacher) adoptSketch(lim *bpf.Limiter) {
	old, err := ebpf.LoadPinnedMap(a.pd.Globals(), nil)
	if errors.Is(err, os.ErrNotExist) {
		return // a first start, or a program of a version before the pin
	}
	if err == nil {
		defer old.Close()
		err = lim.AdoptSketch(old)
	}
	switch {
	case err == nil:
		a.log.Info("carried the source sketch of the program replaced", "from", a.pd.Globals())
	case errors.Is(err, bpf.ErrNoSketch):
		a.log.Info("the program replaced has no source sketch of this layout: the sketch starts empty", "reason", err)
	default:
		a.log.Warn("cannot carry the source sketch of the program replaced: it starts empty (each source group's budget once more in the open window)", "reason", err)
	}
}
