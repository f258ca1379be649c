package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/tiers"
)

// severityDescs are the metrics of severity-aware shedding (DESIGN.md §7),
// part of the agent's collector. Their label sets are bounded: three
// classes and three verdicts, no severity or source labels.
type severityDescs struct {
	packets, protected, paid, debt *prometheus.Desc
}

func newSeverityDescs(d func(name, help string, labels ...string) *prometheus.Desc) severityDescs {
	return severityDescs{
		packets:   d("severity_packets_total", "Selected UDP packets of a policy with a severity block, by severity class (protected, normal, shed_first) and verdict.", "class", "verdict"),
		protected: d("protected_passed_packets_total", "Packets of a protected severity passed although their tier said drop (the window's drop debt)."),
		paid:      d("debt_paid_packets_total", "Unprotected packets dropped although their tier said pass, to pay off the window's drop debt."),
		debt:      d("drop_debt_packets", "The current window's drop debt: protected passes not yet paid off (at most the protect budget)."),
	}
}

func (c severityDescs) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.protected, c.paid, c.debt} {
		ch <- d
	}
}

func (c severityDescs) collect(ch chan<- prometheus.Metric, s Snapshot) {
	for _, cl := range tiers.SeverityClasses {
		for _, v := range tiers.Verdicts {
			ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(s.Stats.Severity[cl][v].Packets), cl.String(), v.String())
		}
	}
	ch <- prometheus.MustNewConstMetric(c.protected, prometheus.CounterValue, float64(s.Stats.ProtectedPass.Packets))
	ch <- prometheus.MustNewConstMetric(c.paid, prometheus.CounterValue, float64(s.Stats.PaidDrop.Packets))
	ch <- prometheus.MustNewConstMetric(c.debt, prometheus.GaugeValue, float64(s.DropDebt))
}
