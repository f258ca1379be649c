// Package promdesc is the one way the agent and its rooms declare and emit
// their Prometheus families (docs/design.md §5): a Set makes each Desc,
// named tierlimit_<name>, next to the collect function that emits it, and
// describes them all; Counter and Gauge emit one ConstMetric sample at
// scrape time. It imports nothing of the module and needs no privilege.
package promdesc

import "github.com/prometheus/client_golang/prometheus"

// Namespace is the prefix of every family: tierlimit_<name>.
const Namespace = "tierlimit"

// Set is the families of one collector: every Desc that Metric made, in
// the order it made them. The zero Set is empty and ready; Metric is meant
// for package-level vars, Describe for scrapes, and the two do not race
// once the package is initialised.
type Set struct{ descs []*prometheus.Desc }

// Metric makes and keeps the Desc of tierlimit_<name>, with help text help
// and the variable labels labels.
func (s *Set) Metric(name, help string, labels ...string) *prometheus.Desc {
	d := prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
	s.descs = append(s.descs, d)
	return d
}

// Describe sends every Desc that Metric made (prometheus.Collector's
// Describe).
func (s *Set) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range s.descs {
		ch <- d
	}
}

// Counter emits one counter sample of d: v, with label values labels.
func Counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

// Gauge emits one gauge sample of d: v, with label values labels.
func Gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}
