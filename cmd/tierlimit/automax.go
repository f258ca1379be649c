package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/tiers"
)

// openAutoSignal opens the collector-socket drop signal of policy p before
// anything is attached: in auto.netns when p sets one, else in this
// namespace. With `max: auto`, a signal that cannot be read is a config
// error (exit 2), never a silent "no drops" (docs/design.md §8); without it,
// nil and no error: an adaptive max that a reload turns on stays at start.
func openAutoSignal(p tiers.Policy) (automax.DropSource, error) {
	if p.Auto == nil {
		src, err := automax.OpenDropSource(false)
		if err != nil {
			return nil, nil
		}
		return src, nil
	}
	src, err := automax.OpenDropSourceIn(p.Auto.NetNS)
	if err == nil {
		return src, nil
	}
	if p.Auto.NetNS != "" {
		return nil, configError{fmt.Errorf("auto.netns %q: %w; name the network namespace where the collector's sockets live: /proc/PID/ns/net of a process in it, or /run/netns/NAME", p.Auto.NetNS, err)}
	}
	return nil, configError{fmt.Errorf("max: auto: the collector socket drops cannot be read in this network namespace: %w", err)}
}

// autoStarter is what startAutoMax needs of the agent (*agent.Agent): its
// adaptive-max controller, in the agent's reload room.
type autoStarter interface {
	StartAutoMax(ctx context.Context, p tiers.Policy, src automax.DropSource) (*automax.Controller, error)
}

// startAutoMax starts the agent's adaptive-max controller on src, the
// signal openAutoSignal opened (nil: none, and no controller). It runs
// whatever the policy, so that a reload can turn `max: auto` on. When the
// controller does not start, src is closed and the error logged.
func startAutoMax(ctx context.Context, log *slog.Logger, a autoStarter, p tiers.Policy, src automax.DropSource) {
	if src == nil {
		return
	}
	if _, err := a.StartAutoMax(ctx, p, src); err != nil {
		src.Close()
		log.Error("adaptive max", "error", err)
	}
}

// printAuto writes the auto settings and the control law of an adaptive
// max, for check; its bounds count c.
func printAuto(w io.Writer, a tiers.AutoMax, c tiers.Count) {
	unit := "selected packets"
	if c == tiers.CountBytes {
		unit = "bytes of syslog payload"
	}
	fmt.Fprintf(w, "max\tauto: starts at %d, moves within [%d, %d] %s per window; the tables below are at start\n",
		a.Start, a.Floor, a.Ceiling, unit)
	fmt.Fprintf(w, "auto signal\treceive-buffer drops of the UDP sockets on the selected ports (sock_diag per socket, else /proc/net/snmp RcvbufErrors), judged once per window, in the middle of the next\n")
	if a.NetNS != "" {
		fmt.Fprintf(w, "auto netns\t%s: the signal is read in that network namespace, where the collector's sockets live; run refuses to start when it cannot be read there\n", a.NetNS)
	}
	for _, l := range tiers.AutoLawLines(a) {
		fmt.Fprintln(w, l)
	}
}
