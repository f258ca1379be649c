package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/agent/license"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/tiers"
)

func init() { subcommands = append(subcommands, newRunCmd) }

type runFlags struct {
	ifaces      []string
	config      string
	xdpMode     string
	mode        string
	metricsAddr string
	noPin       bool
	pinPath     string
	replace     bool
	stateFile   string
	fleetMember string
}

func newRunCmd(g *globals) *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run --iface IF [--iface IF2] [--config F] [--xdp-mode auto|native|generic] [--mode M] [--metrics-addr A] [--no-pin]",
		Short: "Attach the limiter, serve metrics, reload on SIGHUP or config change",
		Long: `run attaches the XDP limiter to each --iface, applies the policy (the
embedded default without --config), serves Prometheus metrics, reloads the
policy on SIGHUP and when the config file changes, and stops on SIGINT or
SIGTERM.

The links and maps are pinned under --pin-path, so limiting goes on while the
agent is down and a restarted agent adopts them without an attach gap;
'tierlimit detach --iface IF' removes them. With --no-pin the limiter is
detached when run stops. run refuses (exit 2) to pin into a bpffs that would
end with it: one private to its mount namespace, as under 'ip netns exec'.

A file change reloads when the content changes, also behind symlinks (a
Kubernetes ConfigMap's ..data swap, a file symlinked from another
directory). A reload with a bad policy keeps the old one running, logs the
error once and counts it in tierlimit_config_reloads_total{result="error"}.
The config must be a regular file of at most 4 MiB.

A policy with fleet: joins its fleet as --fleet-member (the host name by
default). A store that refuses the credentials, or a password_file that
cannot be read, refuses to start (exit 2, naming fleet.password_file); a
store out of reach starts run in the fleet's fallback, with a warning,
until it answers. A reload reads password_file again and takes the new
report, ttl and fallback; another fleet name or store takes a restart.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("state-file") { // the pin path's own (docs/design.md §10)
				f.stateFile = agent.DefaultStatePath(f.pinPath)
			}
			return runAgent(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.ifaces, "iface", nil, "interface to attach to (repeat for several)")
	fl.StringVar(&f.config, "config", "", "policy file, YAML or .properties (default: the embedded default)")
	fl.StringVar(&f.xdpMode, "xdp-mode", "auto", "XDP attach mode: auto (native, else generic), native or generic")
	fl.StringVar(&f.mode, "mode", "", "override the policy's mode: enforce, dry-run or off")
	fl.StringVar(&f.metricsAddr, "metrics-addr", agent.DefaultMetricsAddr, "listen address for /metrics and /healthz; empty disables")
	fl.BoolVar(&f.noPin, "no-pin", false, "do not pin: detach when run stops")
	fl.StringVar(&f.pinPath, "pin-path", agent.DefaultPinPath, "bpffs directory for the pinned links and maps")
	fl.BoolVar(&f.replace, "replace", false, "replace another XDP program already attached to an interface")
	fl.StringVar(&f.fleetMember, "fleet-member", "", "this member's name in the policy's fleet (default: the host name)")
	fl.StringVar(&f.stateFile, "state-file", agent.DefaultStatePath(agent.DefaultPinPath), "where the open or last shedding episode is kept, for 'tierlimit status --shed'; empty disables (default: the --pin-path's own, episode@<pin path>.json beside this one for another pin path)")
	return cmd
}

// reloader builds the reload supervisor of --config and --mode.
func reloader(f runFlags, log *slog.Logger) (*agent.Reloader, error) {
	cfg := agent.ReloaderConfig{Path: f.config, Logger: log}
	if f.mode != "" {
		m, err := tiers.ParseMode(f.mode)
		if err != nil {
			return nil, usageErrorf("--mode: %v", err)
		}
		cfg.Mode = &m
	}
	return agent.NewReloader(cfg), nil
}

// checkRunFlags refuses a command line that cannot run: no --iface, the
// same --iface twice, a bad --xdp-mode or --metrics-addr.
func checkRunFlags(f runFlags) (attach.XDPMode, error) {
	if len(f.ifaces) == 0 {
		return "", usageErrorf("run: at least one --iface is required")
	}
	seen := map[string]bool{}
	for _, name := range f.ifaces {
		if seen[name] {
			return "", usageErrorf("--iface %s given twice", name)
		}
		seen[name] = true
	}
	xdpMode, err := attach.ParseXDPMode(f.xdpMode)
	if err != nil {
		return "", usageErrorf("--xdp-mode: %v", err)
	}
	if f.metricsAddr != "" {
		if _, err := metricsListenAddr(f.metricsAddr); err != nil {
			return "", usageError{err}
		}
	}
	return xdpMode, nil
}

// metricsPort is the port a bare address in --metrics-addr listens on.
const metricsPort = "9713"

// metricsListenAddr is the address to listen on for --metrics-addr s:
// host:port, [IPv6]:port (or [IPv4]:port, which the DaemonSet writes so
// that one form holds either family of $(POD_IP)), or a bare IP literal,
// IPv4 or IPv6 (with a %zone), which listens on port 9713. A bare IPv6
// literal cannot carry a port: "fd00::1:9713" is the address fd00::1:9713.
func metricsListenAddr(s string) (string, error) {
	bare := strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if ip, err := netip.ParseAddr(bare); err == nil && (bare == s || "["+bare+"]" == s) {
		return net.JoinHostPort(ip.String(), metricsPort), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return "", fmt.Errorf("--metrics-addr %q: want host:port, [IPv6]:port or an IP address (port %s), port 0..65535: %v", s, metricsPort, err)
	}
	return net.JoinHostPort(host, port), nil
}

// listenMetrics binds --metrics-addr (nil when empty). It runs before
// anything touches the kernel, so that a bad or busy address fails with
// nothing attached or changed.
func listenMetrics(f runFlags, pinPath string) (net.Listener, error) {
	if f.metricsAddr == "" {
		return nil, nil
	}
	addr, err := metricsListenAddr(f.metricsAddr)
	if err != nil {
		return nil, usageError{err}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if pinPath == "" {
			return nil, fmt.Errorf("metrics listener: %w", err)
		}
		if pid, held := pin.LockHolder(pinPath); held {
			return nil, fmt.Errorf("%w, and it serves %s: stop it first", &pin.AgentRunningError{Pin: pinPath, Pid: pid}, f.metricsAddr)
		}
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	return ln, nil
}

func runAgent(ctx context.Context, g *globals, f runFlags) error {
	log := runLogger(g)
	xdpMode, err := checkRunFlags(f)
	if err != nil {
		return err
	}
	r, err := reloader(f, log)
	if err != nil {
		return err
	}
	defer r.Close()
	p, err := r.Load()
	if err != nil {
		return configError{err}
	}
	pinPath := f.pinPath
	if f.noPin {
		pinPath = ""
	}
	src, err := checkBeforeAttach(ctx, p)
	if err != nil {
		return err
	}
	if src != nil {
		defer func() {
			if src != nil {
				src.Close()
			}
		}()
	}
	ln, err := listenMetrics(f, pinPath)
	if err != nil {
		return err
	}
	if ln != nil {
		defer ln.Close()
	}
	a, err := agent.New(agent.Config{
		Interfaces: f.ifaces,
		XDPMode:    xdpMode,
		PinPath:    pinPath,
		Replace:    f.replace,
		Logger:     log,
		Version:    runVersion(),
	}, p)
	if err != nil {
		return explainAgent(err, pinPath, f.ifaces)
	}
	defer func() {
		a.Close()
		log.Info("stopped")
	}()
	logStarted(log, a, f, p, pinPath)
	err = startRooms(ctx, log, a, p, f, src)
	src = nil // the controller owns it
	if err != nil {
		return err
	}
	serveAndRun(ctx, log, a, r, ln)
	return nil
}

// runLogger is run's logger, on a stderr whose reader may go: a write to
// a closed stderr (journald restarting, a log reader gone) must not kill
// the agent: with SIGPIPE notified, Go returns EPIPE instead of exiting,
// and the log writer drops what it cannot write.
func runLogger(g *globals) *slog.Logger {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	g.stderr = dropEPIPE{g.stderr}
	return g.logger()
}

// checkBeforeAttach refuses, before anything is attached, a fleet
// password_file or store that cannot be used, and a drop signal that
// cannot be read; it returns the adaptive max's signal (nil without
// max: auto), which the caller closes unless the controller takes it.
func checkBeforeAttach(ctx context.Context, p tiers.Policy) (automax.DropSource, error) {
	if err := checkFleetFiles(p); err != nil {
		return nil, err
	}
	if err := checkFleetStore(ctx, p); err != nil {
		return nil, err
	}
	return openAutoSignal(p)
}

// startRooms starts the adaptive max on src (which it owns from then on),
// the fleet controller and the shed record, before the metrics are
// served, so that the first scrape already has their series and the log
// the adaptive max's signal. A fleet store that refuses the credentials
// starts run in fallback with an ERROR (fleet_auth_failed); one out of
// reach starts it in fallback, with a warning; a shed record that cannot
// start is logged.
func startRooms(ctx context.Context, log *slog.Logger, a *agent.Agent, p tiers.Policy, f runFlags, src automax.DropSource) error {
	startAutoMax(ctx, log, a, p, src)
	if _, err := a.StartLicense(ctx, p, licenseStatePath(f.stateFile), nil); err != nil {
		log.Error("license guard: not started", "error", err)
	}
	if err := startFleet(a, p, agent.FleetMember{Name: f.fleetMember, InstanceFile: agent.FleetInstanceFile(f.stateFile)}); err != nil {
		return err
	}
	logFleet(log, p, f.fleetMember)
	if _, err := a.StartRecord(ctx, p, f.stateFile); err != nil {
		log.Error("shed record: not started; shedding goes on unrecorded", "error", err)
	}
	return nil
}

// licenseStatePath is the license state file beside the episode state
// file stateFile; "" (no state) keeps none.
func licenseStatePath(stateFile string) string {
	if stateFile == "" {
		return ""
	}
	return license.StatePathFor(stateFile)
}

// serveAndRun serves the metrics on ln (none when nil), watches the
// attachments and the sources, and runs the reloader until ctx ends; it
// returns once the server has stopped.
func serveAndRun(ctx context.Context, log *slog.Logger, a *agent.Agent, r *agent.Reloader, ln net.Listener) {
	sctx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	if ln != nil {
		served := a.Serve(sctx, ln)
		defer func() { stopServe(); <-served }()
		log.Info("serving metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	}
	go a.Watch(ctx, 2*time.Second)
	go a.WatchSources(ctx, time.Second)
	r.Run(ctx, a, sighup)
	log.Info("stopping", "reason", context.Cause(ctx))
}

// logStarted logs what run attached and which policy it runs.
func logStarted(log *slog.Logger, a *agent.Agent, f runFlags, p tiers.Policy, pinPath string) {
	var ifs []string
	for _, att := range a.Attachments() {
		ifs = append(ifs, att.Iface+"("+att.Mode+")")
	}
	source := "embedded default"
	if f.config != "" {
		source = f.config
	}
	log.Info("started", "interfaces", strings.Join(ifs, ","), "mode", p.Mode.String(), "policy", p.String(),
		"config", source, "pin", pinPath, "local_dests", a.LocalPrefixes())
}

// dropEPIPE is a log writer that drops, rather than fails, a write to a
// pipe or socket whose reader is gone (EPIPE).
type dropEPIPE struct{ w io.Writer }

func (d dropEPIPE) Write(b []byte) (int, error) {
	n, err := d.w.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		return len(b), nil
	}
	return n, err
}
