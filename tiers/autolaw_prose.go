package tiers

import "fmt"

// The control law in words, built once from its constants (autolaw.go), so
// that what tierlimit check prints and what the agent logs say what the
// law does whatever the constants become.

// fillWords names a receive-buffer fill: "half full" for AutoFull's 0.5.
func fillWords(f float64) string {
	if f == 0.5 {
		return "half full"
	}
	return fmt.Sprintf("%.0f%% full", 100*f)
}

// AutoLawLines is the control law of an adaptive max within b, one line
// per part ("auto down", "auto early", "auto up", "auto hold"), each a
// name, a tab and what the law does.
func AutoLawLines(b AutoMax) []string {
	alpha, full := AutoAlpha(b), fillWords(AutoFull)
	return []string{
		fmt.Sprintf("auto down\tsocket drops D while P were delivered: max × max(β, 1 − D/P), at least 1 lower, not below %d; β = %.1f after a window that dropped over %.0f%%, else %.1f; at least a cut to × %.1f when the collector's buffer is over %s (a standing backlog, sock_diag only); no cut in the window after a cut",
			b.Floor, AutoBeta, 100*(1-AutoBeta), AutoBetaFirst, AutoBetaFirst, full),
		fmt.Sprintf("auto early\tno socket drops yet, but a collector socket's receive buffer over %s and %.0f%% of it fuller than in the window before, while shedding (sock_diag only): max × %.1f, as a cut",
			full, 100*AutoRise, AutoBetaFirst),
		fmt.Sprintf("auto up\t%d windows in a row without socket drops while shedding and the collector's buffer under %s: max + %d (start/%d); once max is %d%% over the last max with drops, 1 window and doubling steps up to %d; not above %d",
			AutoK, full, alpha, AutoAlphaDiv, 100/AutoNear, AutoAlphaCap*alpha, b.Ceiling),
		"auto hold\tno change while nothing is shed, or while no collector socket exists; at most one change per window; a reload with the same auto settings keeps the learnt max",
	}
}

// AutoLawSummary is the control law in one line, for the agent's log.
func AutoLawSummary() string {
	return fmt.Sprintf("drops: max×max(%.1f, 1-drops/delivered), at most ×%.1f from a buffer over %s; %d clean windows while shedding: max+step (start/%d, doubling beyond %d%% over the last max with drops, up to ×%d)",
		AutoBeta, AutoBetaFirst, fillWords(AutoFull), AutoK, AutoAlphaDiv, 100/AutoNear, AutoAlphaCap)
}
