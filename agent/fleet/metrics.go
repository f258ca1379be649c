package fleet

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// The values of fleet_reports_total's result label.
const (
	resultOK    = "ok"
	resultError = "error"
	resultSlow  = "slow"
)

// metrics is the controller's state as the collector reads it.
type metrics struct {
	members  atomic.Int64
	offered  atomic.Uint64 // R̂_fleet: own estimate + others at the last report
	others   atomic.Uint64
	storeUp  atomic.Int64
	fallback atomic.Int64
	ok       atomic.Uint64
	errs     atomic.Uint64
	slow     atomic.Uint64
}

func (m *metrics) reports(result string) *atomic.Uint64 {
	switch result {
	case resultOK:
		return &m.ok
	case resultSlow:
		return &m.slow
	default:
		return &m.errs
	}
}

var (
	descMembers = prometheus.NewDesc("tierlimit_fleet_members",
		"Members of the fleet, this one included, as the store last returned them (docs/design.md §12).", nil, nil)
	descOffered = prometheus.NewDesc("tierlimit_fleet_offered",
		"The fleet's offered load per window at the last report: this member's estimate plus the others' sum.", nil, nil)
	descOthers = prometheus.NewDesc("tierlimit_fleet_others",
		"The other members' reported estimates, summed: what the program adds to its own (0 in fallback).", nil, nil)
	descStoreUp = prometheus.NewDesc("tierlimit_fleet_store_up",
		"1 when the last report reached the store in time, else 0.", nil, nil)
	descFallback = prometheus.NewDesc("tierlimit_fleet_fallback",
		"1 while the member applies its fallback because the store has not answered for ttl.", nil, nil)
	descReports = prometheus.NewDesc("tierlimit_fleet_reports_total",
		"Reports to the store by result: ok, error, slow (longer than report).", []string{"result"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Controller) Describe(ch chan<- *prometheus.Desc) { Describe(ch) }

// Describe sends the descriptions of every metric a Controller exports,
// for a collector that holds one only at times (the agent's).
func Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMembers, descOffered, descOthers, descStoreUp, descFallback, descReports} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Controller) Collect(ch chan<- prometheus.Metric) {
	m := &c.m
	ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(m.members.Load()))
	ch <- prometheus.MustNewConstMetric(descOffered, prometheus.GaugeValue, float64(m.offered.Load()))
	ch <- prometheus.MustNewConstMetric(descOthers, prometheus.GaugeValue, float64(m.others.Load()))
	ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, float64(m.storeUp.Load()))
	ch <- prometheus.MustNewConstMetric(descFallback, prometheus.GaugeValue, float64(m.fallback.Load()))
	for _, r := range []string{resultOK, resultError, resultSlow} {
		ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(m.reports(r).Load()), r)
	}
}
