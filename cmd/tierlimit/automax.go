package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/tiers"
)

// openAutoSignal opens the collector-socket drop signal of policy p before
// anything is attached: in auto.netns when p sets one, else in this
// namespace. With `max: auto`, a signal that cannot be read is a config
// error (exit 2), never a silent "no drops" (DESIGN.md §8); without it,
// nil and no error: an adaptive max that a reload turns on stays at start.
func openAutoSignal(p tiers.Policy) (agent.DropSource, error) {
	if p.Auto == nil {
		src, err := agent.OpenDropSource(false)
		if err != nil {
			return nil, nil
		}
		return src, nil
	}
	src, err := agent.OpenDropSourceIn(p.Auto.NetNS)
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
	StartAutoMax(ctx context.Context, p tiers.Policy, src agent.DropSource) (*agent.AutoMax, error)
}

// startAutoMax starts the agent's adaptive-max controller on src, the
// signal openAutoSignal opened (nil: none, and no controller). It runs
// whatever the policy, so that a reload can turn `max: auto` on. When the
// controller does not start, src is closed and the error logged.
func startAutoMax(ctx context.Context, log *slog.Logger, a autoStarter, p tiers.Policy, src agent.DropSource) {
	if src == nil {
		return
	}
	if _, err := a.StartAutoMax(ctx, p, src); err != nil {
		src.Close()
		log.Error("adaptive max", "error", err)
	}
}

// printAuto writes the auto settings and the control law of an adaptive
// max, for check.
func printAuto(w io.Writer, a tiers.AutoMax) {
	alpha := tiers.AutoAlpha(a)
	fmt.Fprintf(w, "max\tauto: starts at %d, moves within [%d, %d] selected packets per window; the tables below are at start\n",
		a.Start, a.Floor, a.Ceiling)
	fmt.Fprintf(w, "auto signal\treceive-buffer drops of the UDP sockets on the selected ports (sock_diag per socket, else /proc/net/snmp RcvbufErrors), judged once per window, in the middle of the next\n")
	if a.NetNS != "" {
		fmt.Fprintf(w, "auto netns\t%s: the signal is read in that network namespace, where the collector's sockets live; run refuses to start when it cannot be read there\n", a.NetNS)
	}
	fmt.Fprintf(w, "auto down\tsocket drops D while P were delivered: max × max(β, 1 − D/P), at least 1 lower, not below %d; β = %.1f after a window that dropped over 30%%, else %.1f; at least a cut to × %.1f when the collector's buffer is over half full (a standing backlog, sock_diag only); no cut in the window after a cut\n",
		a.Floor, tiers.AutoBeta, tiers.AutoBetaFirst, tiers.AutoBetaFirst)
	fmt.Fprintf(w, "auto early\tno socket drops yet, but a collector socket's receive buffer over half full and %.0f%% of it fuller than in the window before, while shedding (sock_diag only): max × %.1f, as a cut\n",
		100*tiers.AutoRise, tiers.AutoBetaFirst)
	fmt.Fprintf(w, "auto up\t%d windows in a row without socket drops while shedding and the collector's buffer under half full: max + %d (start/%d); once max is 10%% over the last max with drops, 1 window and doubling steps up to %d; not above %d\n",
		tiers.AutoK, alpha, tiers.AutoAlphaDiv, tiers.AutoAlphaCap*alpha, a.Ceiling)
	fmt.Fprintf(w, "auto hold\tno change while nothing is shed, or while no collector socket exists; at most one change per window; a reload with the same auto settings keeps the learnt max\n")
}
