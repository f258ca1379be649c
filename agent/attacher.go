package agent

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sysutil"
)

// attacher is the limiter's place on the interfaces: it resolves them,
// loads the program into the pin directory, attaches it (adopting pinned
// links), keeps it attached (Watch), tells the program what it may check
// of each interface (host.go), and lets go of it at Close.
type attacher struct {
	cfg Config
	log *slog.Logger
	lim *bpf.Limiter
	// progID is the id of lim's program: what health checks look for.
	progID uint32
	// nh is a netlink handle in the network namespace New ran in, so that
	// later calls from any goroutine see the same interfaces.
	nh *netlink.Handle
	// ns is the network namespace New ran in (inNS).
	ns netns.NsHandle
	// pd is the pin directory, held while the agent runs; nil unpinned.
	pd *pin.Dir
	// migration carries an older layout's pinned state during New.
	migration *bpf.Migration
	// closed is the Agent's: set once it closes.
	closed *atomic.Bool
	// afterRound, when set, runs after each Watch round, with mu not
	// held: the Agent reads the host's destinations again
	// (refreshLocal), so that an event lost in a storm is never lost for
	// good.
	afterRound func()

	// mu serialises Watch's repairs and Close, and guards attached,
	// pinsLost and ifaces.
	mu       sync.Mutex
	attached []*Attachment
	pinsLost bool // Watch logged the pinned state as gone
	// ifaces is what the program was last told of the attached
	// interfaces (host.go).
	ifaces []bpf.Iface
}

// pinState pins what New made under the pin directory once every link
// runs the program: the migrated maps, the program and the layout record.
// Without pinning there is nothing to pin. It warns of the pinned links
// of interfaces this run was not given.
func (a *attacher) pinState() error {
	if a.pd == nil {
		return nil
	}
	if a.migration != nil {
		err := a.pd.FinishMigration(a.lim, a.migration, a.log)
		a.migration = nil
		if err != nil {
			return err
		}
	}
	if err := a.pd.PinProgram(a.lim.Program()); err != nil {
		return err
	}
	if err := pin.WriteLayout(a.pd.Path(), a.cfg.Version); err != nil {
		return err
	}
	a.warnOtherLinks()
	return nil
}

// startMigration carries an older layout's pinned state into the maps of
// the loaded program, once the policy is applied (pin.Dir.StartMigration);
// nothing when there is none.
func (a *attacher) startMigration() (err error) {
	if a.pd != nil && a.pd.Migrate != nil {
		a.migration, err = a.pd.StartMigration(a.lim)
	}
	return err
}

// resolve opens the netlink handle and looks the interfaces up.
func (a *attacher) resolve() ([]netlink.Link, error) {
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
func (a *attacher) load() (*bpf.Limiter, error) {
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
	info, err := lim.Program().Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	id, _ := info.ID()
	a.progID = uint32(id)
	return lim, nil
}

// attachAll attaches to every interface of links, in New, and tells the
// program what it may check of them.
func (a *attacher) attachAll(links []netlink.Link) error {
	for i, l := range links {
		att, err := a.attach(l)
		if err != nil {
			return fmt.Errorf("attach xdp to %s: %w", a.cfg.Interfaces[i], err)
		}
		a.attached = append(a.attached, att)
		a.log.Info("attached", "iface", att.Iface, "ifindex", att.Index, "mode", att.Mode, "link_id", att.LinkID, "program_id", a.progID)
	}
	if err := a.countSuperPackets(); err != nil {
		return err
	}
	if err := a.describeIfaces(); err != nil {
		return fmt.Errorf("describe interfaces to the program: %w", err)
	}
	return nil
}

// abort undoes a failed New: detaches what it attached unless pinned.
func (a *attacher) abort() {
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
	a.ns.Close()
	a.pd.Release(true)
}

// close lets go of every interface (closeOne) and closes the limiter, as
// the agent stops.
func (a *attacher) close() error {
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
func (a *attacher) Attachments() []Attachment {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Attachment, len(a.attached))
	for i, att := range a.attached {
		out[i] = Attachment{Iface: att.Iface, Index: att.Index, Mode: att.Mode, LinkID: att.LinkID}
	}
	return out
}

// ifname is the name of the attached interface with ifindex i, or "".
func (a *attacher) ifname(i int) string {
	for _, att := range a.Attachments() {
		if att.Index == i {
			return att.Iface
		}
	}
	return ""
}

// ifaceNames are the names of the attached interfaces.
func (a *attacher) ifaceNames() []string {
	var out []string
	for _, att := range a.Attachments() {
		out = append(out, att.Iface)
	}
	return out
}

// inNS runs fn on a locked OS thread in the agent's network namespace.
// Attaching XDP by ifindex (bpf_link_create, netlink's package handle)
// acts on the calling thread's namespace, and Watch may run on any
// goroutine: an ifindex of the agent's namespace must never reach another
// one's interface.
func (a *attacher) inNS(fn func() error) error {
	return sysutil.OnThreadIn(a.ns, "the agent's network namespace", fn)
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
