// Package agent runs tierlimit on a host: it loads the XDP limiter, writes
// the compiled policy into its maps, attaches it to interfaces through
// bpf_links, pins the links and maps under a bpffs directory so that
// limiting survives the agent, reloads policies atomically and exports the
// program's counters to Prometheus.
//
// It needs root, or CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN
// only to mount bpffs, CAP_DAC_OVERRIDE when not uid 0), and Linux >= 5.17
// with BTF (6.2 for generic XDP mode).
//
// The agent is the door; its rooms are packages that never import it,
// each reached through a narrow interface, and their callers import them
// directly:
//   - agent/attach: the limiter's place on the interfaces of one run —
//     resolving and checking them, loading the program into the pin
//     directory, attaching (adopting a pinned link, the netlink fallback),
//     Watch's repairs, what the program may check of each interface, and
//     letting go at Close; its XDPMode, Attachment and the interfaces'
//     errors;
//   - agent/pin: the pin directory, its locks and layout record, the bpffs
//     check, and reading or removing pinned state with no agent running
//     (tierlimit status and detach);
//   - agent/automax: the adaptive max's controller and its drop signal
//     (sock_diag or /proc/net/snmp, in any network namespace); it reaches
//     the agent only through an apply func and a locker;
//   - agent/record: the shed record (docs/design.md §10), the samples, their
//     pcapng files, the episodes and their syslog reports; it reads the
//     limiter through record.Limiter and names interfaces through funcs;
//   - agent/fleet: the fleet controller (docs/design.md §12), its store
//     and its metrics; the agent folds its bound into the policy.
//
// What stays here:
//   - agent.go: Config, the Agent, New, Close; rooms.go: StartAutoMax,
//     StartRecord and the rooms' metrics; fleet.go: StartFleet;
//     status.go: ReadStatus; caps.go, bpfdenied.go, errors.go.
//   - reload.go: apply, the one path from a policy to the settings map
//     (New, Reload, the local addresses' follower, the adaptive max), and
//     the Reloader (SIGHUP, config file changes); configwatch.go and
//     configpoll.go: watching or polling the config path; local.go and
//     localfollow.go: the host's destinations for `dests: local`.
//   - snapshot.go: the Snapshot, one read of the maps, for /metrics and
//     status; metrics.go, severity_metrics.go and sources.go: the
//     collector and its families; serve.go: /metrics and /healthz.
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/agent/license"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// DefaultPinPath is where links and maps are pinned unless told otherwise.
const DefaultPinPath = "/sys/fs/bpf/tierlimit"

// Config configures an Agent.
type Config struct {
	// Interfaces to attach to, by name; at least one.
	Interfaces []string
	// XDPMode is auto, native or generic; empty means auto.
	XDPMode attach.XDPMode
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

// Agent is the running limiter: the door that wires the rooms (the
// interfaces and pins, the adaptive max, the shed record) to one limiter
// and one policy.
type Agent struct {
	cfg Config
	log *slog.Logger
	lim *bpf.Limiter
	// at holds the interfaces the limiter is attached to, and the pins.
	at *attach.Attacher
	// groups reads the multicast groups joined in the agent's namespace
	// (local.go).
	groups localGroups

	// applyMu serialises applies (New, Reload, the local addresses'
	// follower, the adaptive max) and Close; at.mu serialises Watch's
	// repairs and Close, so that /healthz never waits for a reload.
	applyMu sync.Mutex
	// refreshMu serialises refreshLocal's read and apply (the follower's
	// events, Watch's rounds): a read applied after a newer one would drop
	// for a while what the newer one saw.
	refreshMu sync.Mutex

	auto   atomic.Pointer[automax.Controller] // the adaptive-max controller, once started
	record atomic.Pointer[record.Episodes]    // the shed record, once started
	lic    atomic.Pointer[license.Guard]      // the license guard, once started
	fleet  fleetState                         // the fleet controller, once started (fleet.go)

	// given is the policy in force as given (New's or the last
	// reload's): what the rooms learnt or follow (the learnt max, the
	// fleet's fallback, local) resolves it at each apply
	// (tiers.Effective). local is the host's destinations (local.go).
	// Both guarded by applyMu. stopLocal ends follow.follow and
	// followIfaces.
	given     tiers.Policy
	local     []tiers.LocalDest
	stopLocal chan struct{}
	follow    localFollow // what following local counts (localfollow.go)

	// pinsFound: a link was pinned under cfg.PinPath when New began, so
	// the limiter outlived the last agent (the shed record's resume).
	pinsFound bool

	reloadOK, reloadErr atomic.Uint64
	configWatch         atomic.Int32 // a WatchMode, from the Reloader
	scrapeErrors        atomic.Uint64
	closed              atomic.Bool
}

// New loads the limiter (adopting pinned maps and links under
// cfg.PinPath if there are any), applies policy p and attaches to every
// interface. Pinned maps of an older layout, or whose specs differ, are
// migrated (docs/design.md §11): the program is loaded on maps of its own, which
// get what keeps its meaning and the policy; the pinned links switch to it
// in place; then its maps are pinned in place of the old ones. The old
// program never sees the new policy: same-layout maps are shared, and a
// policy written into them is read alike by both programs, as on a reload. On error nothing stays attached that was not before, and a
// pin directory this call made is removed.
//
// Returns ErrNotRoot without the capabilities, the interfaces' errors of
// agent/attach (pin.ErrNoInterface for a missing interface,
// attach.ErrDuplicateInterface for one given twice, *attach.LinkTypeError
// (attach.ErrNotEthernet) for an interface whose frames have no Ethernet
// header, attach.ErrStacked when two interfaces are stacked on each other,
// *pin.ForeignProgramError when an interface runs another XDP program and
// cfg.Replace is false, *pin.BusyError when it runs a tierlimit this agent
// cannot adopt, attach.ErrNativeRefused), *pin.AgentRunningError when another
// agent holds cfg.PinPath, *pin.NewerLayoutError for pinned state of a newer
// layout (nothing is written then), pin.ErrPinPath, *pin.PrivateBPFFSError when
// the bpffs at cfg.PinPath would end with the agent (nothing is attached
// then), and tiers errors for a policy that does not compile.
func New(cfg Config, p tiers.Policy) (_ *Agent, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.XDPMode == "" {
		cfg.XDPMode = attach.XDPAuto
	}
	if len(cfg.Interfaces) == 0 {
		return nil, fmt.Errorf("%w: no interface given", pin.ErrNoInterface)
	}
	if err := checkCaps(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, stopLocal: make(chan struct{})}
	a.at = attach.New(attach.Config{Interfaces: cfg.Interfaces, XDPMode: cfg.XDPMode, PinPath: cfg.PinPath,
		Replace: cfg.Replace, Logger: cfg.Logger, Version: cfg.Version, Closed: a.closed.Load, AfterRound: a.refreshLocal})
	a.fleet.log = cfg.Logger
	defer func() {
		if err != nil {
			a.abort()
		}
	}()
	links, err := a.at.Resolve()
	if err != nil {
		return nil, err
	}
	a.pinsFound = cfg.PinPath != "" && hasPinnedLinks(cfg.PinPath)
	// bpf(2) refused here, with the capabilities checked, is a filter:
	// say so before the memlock probe words it as a limit.
	if err := probeBPF(); isDenied(err) {
		return nil, classifyBPFError(err, seccompMode())
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock rlimit: %w", err)
	}
	if a.lim, err = a.at.Load(); err != nil {
		return nil, err
	}
	if a.local, err = a.groups.dests(a.at.Handle(), a.log); err != nil {
		return nil, fmt.Errorf("read local addresses: %w", err)
	}
	a.log.Debug("dests local: the host's destinations", "local", a.local)
	if err := a.apply(context.Background(), p, &newPolicy{a: a}); err != nil {
		return nil, fmt.Errorf("apply policy: %w", err)
	}
	if err := a.at.StartMigration(); err != nil {
		return nil, err
	}
	if err := a.at.AttachAll(links); err != nil {
		return nil, err
	}
	// Following starts once attached: a start that fails says only why.
	// It reads the whole list again when it subscribes, so a change
	// since the read above is not lost.
	go a.follow.follow(a.stopLocal, dupNS(a.at.NS()), a.log, a.refreshLocal)
	go a.at.FollowIfaces(a.stopLocal, dupNS(a.at.NS()))
	return a, a.at.PinState()
}

// abort undoes a failed New: detaches what it attached unless pinned.
func (a *Agent) abort() {
	// Ends follow.follow and at.FollowIfaces, which may have started.
	a.closed.Store(true)
	close(a.stopLocal)
	waitOut(&a.refreshMu)
	a.at.Abort()
	a.groups.close()
}

// Limiter is the loaded program and maps.
func (a *Agent) Limiter() *bpf.Limiter { return a.lim }

// Attachments lists the interfaces the limiter is attached to.
func (a *Agent) Attachments() []attach.Attachment { return a.at.Attachments() }

// Attached reports whether the limiter is attached to every interface:
// each one, in the agent's network namespace, runs the agent's own program
// (by program id) through the agent's link. A program that is not the
// agent's on a reused ifindex is not attached.
func (a *Agent) Attached() bool { return a.at.Attached() }

// Ifaces returns what the program was last told of the attached
// interfaces.
func (a *Agent) Ifaces() []bpf.Iface { return a.at.Ifaces() }

// Watch checks, every interval until ctx ends, that the limiter is what
// the agent says it is, and repairs what it can (attach.Attacher.Watch): renamed,
// deleted and re-created interfaces, foreign programs, removed pins.
func (a *Agent) Watch(ctx context.Context, interval time.Duration) { a.at.Watch(ctx, interval) }

// Close stops the agent. Without pinning it detaches the limiter; with
// pinning the limiter stays attached and counting. Either way the log says
// what is really left on each interface, checked with the kernel.
func (a *Agent) Close() error {
	if a.closed.Swap(true) {
		return nil
	}
	close(a.stopLocal)
	a.fleet.stop()      // leaves the fleet; before applyMu, which its loop may wait for
	a.lic.Load().Stop() // the license's state written; before applyMu, likewise
	waitOut(&a.refreshMu)
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	err := a.at.Close()
	a.groups.close()
	return err
}

// waitOut waits out the holder of mu, if any: Close and a failed New wait
// out a refreshLocal in flight (refreshMu), which reads through the
// netlink handle and the groups' socket that closing closes; once closed
// is set, every later one returns at once. Before it, a refresh that
// passed its check read a closed handle ("bad file descriptor"), logged
// on the way out of a failed start (TestSecondRunNoPin).
func waitOut(mu *sync.Mutex) {
	mu.Lock()
	defer mu.Unlock()
}
