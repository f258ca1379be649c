package fleet

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/internal/promdesc"
)

// connMetrics is the state of the store's connections as the collector
// reads it.
type connMetrics struct {
	authFailed atomic.Int64  // 1 while the store refuses the credentials
	dials      atomic.Uint64 // every dial to a store address
}

var (
	descAuthFailed = descs.Metric("fleet_auth_failed",
		"1 while the store refuses this member's credentials (password, ACL user, client certificate, or the server's certificate not verified); the member is in fallback after ttl and keeps retrying.")
	descDials = descs.Metric("fleet_store_dials_total",
		"Connections the member opened, or tried to open, to the store's addresses (Sentinels, masters and Cluster nodes included).")
)

// collectConn sends the connections' metrics.
func (c *Controller) collectConn(ch chan<- prometheus.Metric) {
	promdesc.Gauge(ch, descAuthFailed, float64(c.cm.authFailed.Load()))
	promdesc.Counter(ch, descDials, c.cm.dials.Load())
}
