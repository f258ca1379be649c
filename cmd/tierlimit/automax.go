package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/tiers"
)

// startAutoMax starts the agent's adaptive-max controller on the collector
// socket drops of this namespace. It runs whatever the policy, so that a
// reload can turn `max: auto` on; without a drop signal an adaptive max
// stays at its start.
func startAutoMax(ctx context.Context, log *slog.Logger, a *agent.Agent, p tiers.Policy) {
	src, err := agent.OpenDropSource(false)
	if err != nil {
		if p.Auto != nil {
			log.Error("adaptive max: no collector socket drop signal; max stays at start", "max", p.Max, "error", err)
		}
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
	fmt.Fprintf(w, "auto down\tsocket drops D while P were delivered: max × max(β, 1 − D/P), at least 1 lower, not below %d; β = %.1f after a window that dropped over 30%%, else %.1f; no cut in the window after a cut\n",
		a.Floor, tiers.AutoBeta, tiers.AutoBetaFirst)
	fmt.Fprintf(w, "auto early\tno socket drops yet, but a collector socket's receive buffer over half full and %.0f%% of it fuller than in the window before, while shedding (sock_diag only): max × %.1f, as a cut\n",
		100*tiers.AutoRise, tiers.AutoBetaFirst)
	fmt.Fprintf(w, "auto up\t%d windows in a row without socket drops while shedding and the collector's buffer under half full: max + %d (start/%d); once max is 10%% over the last max with drops, 1 window and doubling steps up to %d; not above %d\n",
		tiers.AutoK, alpha, tiers.AutoAlphaDiv, tiers.AutoAlphaCap*alpha, a.Ceiling)
	fmt.Fprintf(w, "auto hold\tno change while nothing is shed, or while no collector socket exists; at most one change per window; a reload with the same auto settings keeps the learnt max\n")
}
