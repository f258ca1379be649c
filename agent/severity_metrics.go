package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/tiers"
)

// The metrics of severity-aware shedding (docs/design.md §7). Their label sets
// are bounded: three classes and three verdicts, no severity or source
// labels.
var (
	severityPacketsDesc = metric("severity_packets_total", "Selected UDP packets of a policy with a severity block, by severity class (protected, normal, shed_first) and verdict.", "class", "verdict")
	protectedPassDesc   = metric("protected_passed_packets_total", "Packets of a protected severity passed although their tier said drop (the window's drop debt).")
	debtPaidDesc        = metric("debt_paid_packets_total", "Unprotected packets dropped although their tier said pass, to pay off the window's drop debt.")
	dropDebtDesc        = metric("drop_debt_packets", "The current window's drop debt: protected passes not yet paid off (at most the protect budget).")
)

// collectSeverity emits the severity families of snapshot s.
func collectSeverity(ch chan<- prometheus.Metric, s Snapshot) {
	for _, cl := range tiers.SeverityClasses {
		for _, v := range tiers.Verdicts {
			counter(ch, severityPacketsDesc, s.Stats.Severity[cl][v].Packets, cl.String(), v.String())
		}
	}
	counter(ch, protectedPassDesc, s.Stats.ProtectedPass.Packets)
	counter(ch, debtPaidDesc, s.Stats.PaidDrop.Packets)
	gauge(ch, dropDebtDesc, float64(s.DropDebt))
}
