package fleet

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/internal/promdesc"
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
	viewAt   atomic.Int64 // unix ns of the last answer (of Start before any)
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

// descs is every Desc of the controller's families, for Describe.
var descs promdesc.Set

var (
	descMembers = descs.Metric("fleet_members",
		"Members of the fleet, this one included, as the store last returned them (docs/design.md §12).")
	descOffered = descs.Metric("fleet_offered",
		"The fleet's offered load per window at the last report: this member's estimate plus the others' sum.")
	descOthers = descs.Metric("fleet_others",
		"The other members' reported estimates, summed: what the program adds to its own (0 in fallback).")
	descStoreUp = descs.Metric("fleet_store_up",
		"1 when the last report reached the store in time, else 0.")
	descFallback = descs.Metric("fleet_fallback",
		"1 while the member applies its fallback because the store has not answered for ttl.")
	descViewAge = descs.Metric("fleet_view_age_seconds",
		"Seconds since the store last answered: the age of the others' sums the program judges with, until ttl (then it judges alone on the fallback); since the controller started when the store never answered.")
	descReports = descs.Metric("fleet_reports_total",
		"Reports to the store by result: ok, error, slow (longer than report).", "result")
)

// Describe implements prometheus.Collector.
func (c *Controller) Describe(ch chan<- *prometheus.Desc) { Describe(ch) }

// Describe sends the descriptions of every metric a Controller exports,
// for a collector that holds one only at times (the agent's).
func Describe(ch chan<- *prometheus.Desc) { descs.Describe(ch) }

// Collect implements prometheus.Collector.
func (c *Controller) Collect(ch chan<- prometheus.Metric) {
	m := &c.m
	promdesc.Gauge(ch, descMembers, float64(m.members.Load()))
	promdesc.Gauge(ch, descOffered, float64(m.offered.Load()))
	promdesc.Gauge(ch, descOthers, float64(m.others.Load()))
	promdesc.Gauge(ch, descStoreUp, float64(m.storeUp.Load()))
	promdesc.Gauge(ch, descFallback, float64(m.fallback.Load()))
	promdesc.Gauge(ch, descViewAge, time.Since(time.Unix(0, m.viewAt.Load())).Seconds())
	for _, r := range []string{resultOK, resultError, resultSlow} {
		promdesc.Counter(ch, descReports, m.reports(r).Load(), r)
	}
	c.collectConn(ch)
}
