package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/spf13/cobra"

	"github.com/tierlimit/tierlimit/agent"
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
detached when run stops.

A reload with a bad policy keeps the old one running, logs the error and
counts it in tierlimit_config_reloads_total{result="error"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
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
	return cmd
}

// loadPolicy reads the policy of --config (or the default) and applies --mode.
func loadPolicy(config, mode string) (tiers.Policy, error) {
	p := tiers.Default()
	if config != "" {
		var err error
		if p, err = tiers.LoadFile(config); err != nil {
			return p, configError{err}
		}
	}
	if mode != "" {
		m, err := tiers.ParseMode(mode)
		if err != nil {
			return p, usageErrorf("--mode: %v", err)
		}
		p.Mode = m
	}
	return p, nil
}

func runAgent(ctx context.Context, g *globals, f runFlags) error {
	log := g.logger()
	if len(f.ifaces) == 0 {
		return usageErrorf("run: at least one --iface is required")
	}
	xdpMode, err := agent.ParseXDPMode(f.xdpMode)
	if err != nil {
		return usageErrorf("--xdp-mode: %v", err)
	}
	p, err := loadPolicy(f.config, f.mode)
	if err != nil {
		return err
	}
	pin := f.pinPath
	if f.noPin {
		pin = ""
	}
	// Bind the metrics listener before anything touches the kernel, so that
	// a bad or busy address fails with nothing attached or changed.
	var ln net.Listener
	if f.metricsAddr != "" {
		_, port, err := net.SplitHostPort(f.metricsAddr)
		if err == nil {
			_, err = strconv.ParseUint(port, 10, 16)
		}
		if err != nil {
			return usageErrorf("--metrics-addr %q: want host:port, port 0..65535: %v", f.metricsAddr, err)
		}
		if ln, err = net.Listen("tcp", f.metricsAddr); err != nil {
			if pid, held := agent.LockHolder(pin); pin != "" && held {
				return fmt.Errorf("%w (%s, pid %s), and it serves %s: stop it first", agent.ErrAgentRunning, pin, pid, f.metricsAddr)
			}
			return fmt.Errorf("metrics listener: %w", err)
		}
		defer ln.Close()
	}
	a, err := agent.New(agent.Config{
		Interfaces: f.ifaces,
		XDPMode:    xdpMode,
		PinPath:    pin,
		Replace:    f.replace,
		Logger:     log,
	}, p)
	if err != nil {
		return err
	}
	defer func() {
		a.Close()
		log.Info("stopped")
	}()

	var ifs []string
	for _, att := range a.Attachments() {
		ifs = append(ifs, att.Iface+"("+att.Mode+")")
	}
	source := "embedded default"
	if f.config != "" {
		source = f.config
	}
	log.Info("started", "interfaces", strings.Join(ifs, ","), "mode", p.Mode.String(), "policy", p.String(),
		"config", source, "pin", pin)

	if ln != nil {
		a.Serve(ctx, ln)
		log.Info("serving metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	}

	reload := func(why string) {
		np, err := loadPolicy(f.config, f.mode)
		if err == nil {
			err = a.Reload(np)
		} else {
			a.ReloadFailed()
		}
		if err != nil {
			log.Error("reload refused, the old policy keeps running", "trigger", why, "error", err)
			return
		}
		log.Info("reloaded", "trigger", why, "mode", np.Mode.String(), "policy", np.String())
	}

	go a.Watch(ctx, 2*time.Second)
	startAutoMax(ctx, log, a, p)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	var changed <-chan struct{}
	var lastSum [sha256.Size]byte
	if f.config != "" {
		lastSum, _ = fileSum(f.config)
		c, stop, err := watchFile(f.config, log)
		if err != nil {
			log.Warn("config file not watched; reload with SIGHUP", "error", err)
		} else {
			defer stop()
			changed = c
		}
	}
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping", "reason", context.Cause(ctx))
			return nil
		case <-hup:
			reload("SIGHUP")
		case <-changed:
			// Any event in the config's directory lands here (editors that
			// save by rename, Kubernetes ConfigMaps that swap a symlink);
			// reload only when the file's content differs from the last read.
			if sum, err := fileSum(f.config); err != nil || sum != lastSum {
				lastSum = sum
				reload("file change")
			}
		}
	}
}

// fileSum is the SHA-256 of the file at path (following symlinks).
func fileSum(path string) ([sha256.Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b), nil
}

// watchFile reports events in path's directory, coalescing bursts into one
// report 200ms after the last event. Watching the directory, not the file,
// sees an editor that writes a new file and renames it over path, and a
// symlink swapped to a new target.
func watchFile(path string, log *slog.Logger) (<-chan struct{}, func(), error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, nil, err
	}
	if err := w.Add(filepath.Dir(abs)); err != nil {
		w.Close()
		return nil, nil, err
	}
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		var timer <-chan time.Time
		for {
			select {
			case <-done:
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if !ev.Has(fsnotify.Write | fsnotify.Create | fsnotify.Rename | fsnotify.Remove) {
					continue
				}
				timer = time.After(200 * time.Millisecond)
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				if !errors.Is(err, fsnotify.ErrEventOverflow) {
					log.Warn("config watch", "error", err)
				}
				timer = time.After(200 * time.Millisecond)
			case <-timer:
				timer = nil
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, func() { close(done); w.Close() }, nil
}
