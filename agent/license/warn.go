package license

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/internal/promdesc"
)

// The warnings' levels: warn_at passed, and the day spent.
const (
	levelWarn  = 1
	levelSpent = 2
)

var levelNames = [...]string{levelWarn: "warn", levelSpent: "spent"}

// warn gives the warnings due at now (g.mu held): once a day each, at
// warn_at × per_day and at per_day, a log line, an event to
// events.syslog (RFC 5424, the episodes' format: MSGID license-warn or
// license-spent, severity warning or error) and a count in
// license_warnings_total{level}.
func (g *Guard) warn(now time.Time) {
	level := 0
	switch {
	case g.spent >= g.lic.PerDay:
		level = levelSpent
	case float64(g.spent) >= math.Floor(float64(g.lic.PerDay)*g.lic.WarnAt.Ratio()):
		level = levelWarn
	}
	for l := g.warned + 1; l <= level; l++ {
		g.warnings[l-1].Add(1)
		g.notice(l, now)
	}
	g.warned = max(g.warned, level)
}

// notice logs and sends the warning of level l.
func (g *Guard) notice(l int, now time.Time) {
	proj := g.projected()
	pct := 100 * float64(g.spent) / float64(g.lic.PerDay)
	var msg string
	sev := 4 // warning (RFC 5424 §6.2.1)
	if l == levelSpent {
		sev = 3 // error
		msg = fmt.Sprintf("license spent: %d of %d bytes (%.1f%%) passed in the day that began %s; protected traffic still passes",
			g.spent, g.lic.PerDay, pct, g.day.Start.Format(time.RFC3339))
	} else {
		msg = fmt.Sprintf("license at %.1f%% (warn_at %s): %d of %d bytes passed in the day that began %s; %d projected by its end",
			pct, g.lic.WarnAt, g.spent, g.lic.PerDay, g.day.Start.Format(time.RFC3339), proj)
	}
	params := [][2]string{{"event", "license-" + levelNames[l]}, {"spent", strconv.FormatUint(g.spent, 10)},
		{"per_day", strconv.FormatUint(g.lic.PerDay, 10)}, {"projected", strconv.FormatUint(proj, 10)},
		{"day_start", g.day.Start.Format(time.RFC3339)}, {"zone", g.lic.ZoneName}}
	if g.cfg.Notify != nil {
		g.cfg.Notify(sev, now, "license-"+levelNames[l], params, msg)
	}
	attrs := make([]any, 0, 2*len(params))
	for _, p := range params[1:] {
		attrs = append(attrs, p[0], p[1])
	}
	if l == levelSpent {
		g.cfg.Log.Error(msg, attrs...)
	} else {
		g.cfg.Log.Warn(msg, attrs...)
	}
}

// projected is the day's spend at its end at the current rate: spent +
// rate × the time left (g.mu held).
func (g *Guard) projected() uint64 {
	left := max(g.day.End.Sub(g.cfg.Clock.Now()), 0)
	return g.spent + uint64(g.rate*left.Seconds())
}

// The license's metrics (docs/design.md §5, §13), while the policy has a
// license.
var (
	descs       promdesc.Set
	budgetDesc  = descs.Metric("license_budget_bytes", "The license's daily volume (license.per_day), bytes.")
	warnAtDesc  = descs.Metric("license_warn_bytes", "The spend at which the license warns: warn_at × per_day, bytes.")
	spentDesc   = descs.Metric("license_spent_bytes", "Bytes passed in the license day so far (the fleet's total with fleet:).")
	projDesc    = descs.Metric("license_projected_bytes", "The day's spend at its end at the current rate, bytes.")
	paceDesc    = descs.Metric("license_pace_bytes", "The pacing line: per_day × the share of the license day gone, bytes.")
	windowDesc  = descs.Metric("license_window_budget_bytes", "The window's byte budget the license allows (the max compiled is at most this).")
	targetDesc  = descs.Metric("license_window_target_bytes", "The bytes the pacing law wants the window to pass.")
	warningDesc = descs.Metric("license_warnings_total", "License warnings given, by level: warn (warn_at passed), spent (per_day passed).", "level")
	dayDesc     = descs.Metric("license_day_start_seconds", "The license day's start, Unix seconds.")
)

// Describe sends the license's Descs.
func Describe(ch chan<- *prometheus.Desc) { descs.Describe(ch) }

// Describe sends the license's Descs.
func (g *Guard) Describe(ch chan<- *prometheus.Desc) { Describe(ch) }

// Collect emits the license's metrics; nothing while the policy has no
// license (or g is nil).
func (g *Guard) Collect(ch chan<- prometheus.Metric) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lic == nil {
		return
	}
	now := g.cfg.Clock.Now()
	gone := min(max(now.Sub(g.day.Start), 0), g.day.Len())
	promdesc.Gauge(ch, budgetDesc, float64(g.lic.PerDay))
	promdesc.Gauge(ch, warnAtDesc, math.Floor(float64(g.lic.PerDay)*g.lic.WarnAt.Ratio()))
	promdesc.Gauge(ch, spentDesc, float64(g.spent))
	promdesc.Gauge(ch, projDesc, float64(g.projected()))
	promdesc.Gauge(ch, paceDesc, float64(g.lic.PerDay)*float64(gone)/float64(g.day.Len()))
	promdesc.Gauge(ch, windowDesc, float64(g.max))
	promdesc.Gauge(ch, targetDesc, float64(g.pace.Target))
	promdesc.Gauge(ch, dayDesc, float64(g.day.Start.Unix()))
	for i, n := range levelNames[1:] {
		promdesc.Counter(ch, warningDesc, g.warnings[i].Load(), n)
	}
}
