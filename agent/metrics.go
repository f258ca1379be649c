package agent

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// DefaultMetricsAddr is where /metrics listens unless told otherwise.
const DefaultMetricsAddr = "127.0.0.1:9713"

const ns = "tierlimit"

// collector reads the BPF maps at scrape time (DESIGN.md §5). Counters come
// from per-CPU maps summed over CPUs, so they survive agent restarts.
type collector struct {
	a *Agent

	selectedPackets, selectedBytes   *prometheus.Desc
	unselected, exempt, fragments    *prometheus.Desc
	windowPackets, lastWindow, tier  *prometheus.Desc
	windowsOpened                    *prometheus.Desc
	policyMax, tierThreshold, tierDr *prometheus.Desc
	policyMode                       *prometheus.Desc
	reloads, attached, scrapeErrors  *prometheus.Desc
	severity                         severityDescs
	malformed                        *prometheus.Desc
}

// Collector returns the agent's prometheus.Collector.
func (a *Agent) Collector() prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, labels, nil)
	}
	return &collector{
		a:               a,
		selectedPackets: d("selected_packets_total", "Selected packets by tier and verdict (pass, drop, would_drop).", "tier", "verdict"),
		selectedBytes:   d("selected_bytes_total", "Selected bytes (L2 frame length) by tier and verdict.", "tier", "verdict"),
		unselected:      d("unselected_packets_total", "Packets passed without counting: not selected, malformed, truncated or nested too deep."),
		exempt:          d("exempt_packets_total", "Selected packets from exempt sources, passed without counting."),
		fragments:       d("fragment_packets_total", "Non-first IP fragments, which follow their first fragment's verdict, by verdict.", "verdict"),
		windowPackets:   d("window_packets", "Selected packets counted in the current window (n); 0 once it has expired."),
		lastWindow:      d("last_window_packets", "Final count of the previous window: the offered load, in packets."),
		tier:            d("current_tier", "Tier of the latest selected packet of the current window (0 below the first threshold)."),
		windowsOpened:   d("windows_opened_total", "Windows opened since the maps were created."),
		policyMax:       d("policy_max_packets", "The policy's max: selected packets per window the host is meant to handle."),
		policyMode:      d("policy_mode", "1 for the policy's mode (enforce, dry-run, off), 0 for the others.", "mode"),
		tierThreshold:   d("policy_tier_threshold_packets", "First packet count n of each tier (T_k), as the compiled table applies it.", "tier"),
		tierDr:          d("policy_tier_drop_ratio", "Drop ratio (0..1) of each tier.", "tier"),
		reloads:         d("config_reloads_total", "Policy reloads by result (success, error).", "result"),
		attached:        d("xdp_attached", "1 while the limiter is attached to the interface, by XDP mode.", "iface", "mode"),
		scrapeErrors:    d("scrape_errors_total", "BPF map reads that failed during a scrape."),
		severity:        newSeverityDescs(d),
		malformed: d("malformed_packets_total", "Frames whose length fields disagree with the frame, by reason; passed uncounted, "+
			"except tiny fragments (RFC 1858), which enforce mode drops.", "reason"),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.selectedPackets, c.selectedBytes, c.unselected, c.exempt, c.fragments,
		c.windowPackets, c.lastWindow, c.tier, c.windowsOpened, c.policyMax, c.policyMode, c.tierThreshold, c.tierDr,
		c.reloads, c.attached, c.scrapeErrors, c.malformed,
	} {
		ch <- d
	}
	c.severity.describe(ch)
	describeAuto(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(c.reloads, a.reloadOK.Load(), "success")
	counter(c.reloads, a.reloadErr.Load(), "error")
	for _, att := range a.Attachments() {
		up := 0.0
		if a.attachedTo(att.Index) {
			up = 1
		}
		gauge(c.attached, up, att.Iface, att.Mode)
	}

	s, err := TakeSnapshot(a.lim)
	if err != nil {
		a.scrapeErrors.Add(1)
		a.log.Warn("scrape: read BPF maps", "error", err)
	} else {
		for t := range s.Stats.Selected {
			tier := strconv.Itoa(t)
			// Every tier of the policy, and any tier an earlier policy
			// counted in: counters never vanish.
			if t > len(s.Policy.Bounds) && s.Stats.Selected[t] == [bpf.Verdicts]bpf.Counter{} {
				continue
			}
			for _, v := range tiers.Verdicts {
				counter(c.selectedPackets, s.Stats.Selected[t][v].Packets, tier, v.String())
				counter(c.selectedBytes, s.Stats.Selected[t][v].Bytes, tier, v.String())
			}
			if t > len(s.Policy.Bounds) {
				continue
			}
			if t > 0 {
				gauge(c.tierThreshold, float64(s.Policy.Bounds[t-1]), tier)
			}
			gauge(c.tierDr, s.Policy.DropRatios[t], tier)
		}
		for _, m := range []tiers.Mode{tiers.ModeEnforce, tiers.ModeDryRun, tiers.ModeOff} {
			v := 0.0
			if m == s.Policy.Mode {
				v = 1
			}
			gauge(c.policyMode, v, m.String())
		}
		counter(c.unselected, s.Stats.Unselected.Packets)
		counter(c.exempt, s.Stats.Exempt.Packets)
		counter(c.fragments, s.Stats.FragmentPass.Packets, "pass")
		counter(c.fragments, s.Stats.FragmentDrop.Packets, "drop")
		for _, m := range tiers.MalformedReasons {
			counter(c.malformed, s.Stats.Malformed[m].Packets, m.String())
		}
		gauge(c.windowPackets, float64(s.WindowPackets))
		gauge(c.lastWindow, float64(s.LastWindowPackets))
		gauge(c.tier, float64(s.CurrentTier))
		counter(c.windowsOpened, s.WindowsOpened)
		gauge(c.policyMax, float64(s.Policy.Max))
		c.severity.collect(ch, s)
	}
	counter(c.scrapeErrors, a.scrapeErrors.Load())
	a.collectAuto(ch)
}

// Registry returns a registry with the agent's collector and the Go and
// process collectors.
func (a *Agent) Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.Collector(), a.SourcesCollector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves /metrics (promhttp, with a timeout and a limit on
// concurrent scrapes) and /healthz, which is 200 only while the limiter is
// attached to every interface.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.Registry(), promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if !a.Attached() {
			http.Error(w, "not attached\n", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}
