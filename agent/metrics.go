package agent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/promdesc"
	"github.com/tierlimit/tierlimit/tiers"
)

// The metrics (docs/design.md §5) take one path from the maps: the collector
// takes one Snapshot per scrape and hands it to each feature's collect
// function (collectTiers, collectPolicy, collectSeverity, collectSources,
// collectAuto, collectRecord, collectConfigWatch), all of one shape; the
// host's destinations (localFollow.collect) come from the follower's own
// counts. A feature declares its Descs with metric, next to its collect
// function; adding a metric touches that one place. The fleet's families
// (§12) are not here: the fleet controller is a collector of its own
// (fleetCollector, fleet.go), which serve.go registers beside this one.

// descs is every Desc that metric made, for Describe.
var descs promdesc.Set

// metric makes the Desc of tierlimit_<name> (promdesc.Set.Metric).
func metric(name, help string, labels ...string) *prometheus.Desc {
	return descs.Metric(name, help, labels...)
}

// counter and gauge emit one sample of d (promdesc.Counter, promdesc.Gauge).
func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	promdesc.Counter(ch, d, v, labels...)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	promdesc.Gauge(ch, d, v, labels...)
}

// The families the agent keeps itself rather than the maps.
var (
	reloadsDesc      = metric("config_reloads_total", "Policy reloads by result (success, error).", "result")
	attachedDesc     = metric("xdp_attached", "1 while the limiter is attached to the interface, by XDP mode.", "iface", "mode")
	scrapeErrorsDesc = metric("scrape_errors_total", "BPF map reads that failed during a scrape.")
)

// collector reads the BPF maps at scrape time (docs/design.md §5). Counters come
// from per-CPU maps summed over CPUs, so they survive agent restarts.
type collector struct {
	a *Agent
	// read takes the scrape's one Snapshot of the maps.
	read func() (Snapshot, error)
}

// Collector returns the agent's prometheus.Collector: every tierlimit_
// family but the fleet's (fleetCollector), from one read of the maps per
// scrape.
func (a *Agent) Collector() prometheus.Collector {
	return newCollector(a, a.lim)
}

// newCollector is a's collector, reading the maps through r.
func newCollector(a *Agent, r mapReader) *collector {
	return &collector{a: a, read: func() (Snapshot, error) { return takeSnapshot(r) }}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { descs.Describe(ch) }

// mapFamilies are the features whose families come from the maps: emitted
// only when the scrape's snapshot could be read.
var mapFamilies = []func(chan<- prometheus.Metric, Snapshot){
	collectTiers, collectPolicy, collectSeverity, collectSources,
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	counter(ch, reloadsDesc, a.reloadOK.Load(), "success")
	counter(ch, reloadsDesc, a.reloadErr.Load(), "error")
	for _, att := range a.Attachments() {
		up := 0.0
		if a.at.AttachedTo(att.Index) {
			up = 1
		}
		gauge(ch, attachedDesc, up, att.Iface, att.Mode)
	}

	s, err := c.read()
	if err != nil {
		a.scrapeErrors.Add(1)
		a.log.Warn("scrape: read BPF maps", "error", err)
	} else {
		for _, collect := range mapFamilies {
			collect(ch, s)
		}
	}
	counter(ch, scrapeErrorsDesc, a.scrapeErrors.Load())
	a.follow.collect(ch)
	roomCounts(&s, a.auto.Load(), a.record.Load())
	collectAuto(ch, s)
	collectRecord(ch, s)
	s.ConfigWatch = WatchMode(a.configWatch.Load())
	collectConfigWatch(ch, s)
}

// The limiter's traffic, window and policy families.
var (
	selectedPacketsDesc = metric("selected_packets_total", "Selected packets by tier and verdict (pass, drop, would_drop).", "tier", "verdict")
	selectedBytesDesc   = metric("selected_bytes_total", "Selected bytes (L2 frame length) by tier and verdict.", "tier", "verdict")
	unselectedDesc      = metric("unselected_packets_total", "Packets passed without counting: not selected, malformed, truncated or nested too deep.")
	exemptDesc          = metric("exempt_packets_total", "Selected packets from exempt sources, passed without counting.")
	fragmentsDesc       = metric("fragment_packets_total", "Non-first IP fragments, which follow their first fragment's verdict, by verdict.", "verdict")
	malformedDesc       = metric("malformed_packets_total", "Frames whose length fields or IPv4 header checksum the kernel rejects, by reason; passed uncounted, "+
		"except tiny fragments (RFC 1858), which enforce mode drops.", "reason")
	unclassifiedDesc = metric("unclassified_packets_total", "Frames the kernel may deliver whose port the program cannot tell, by reason; "+
		"judged as selected, so they are in selected_packets_total (or exempt_packets_total) too.", "reason")
	windowPacketsDesc = metric("window_packets", "Selected packets counted in the current window (n); 0 once it has expired.")
	lastWindowDesc    = metric("last_window_packets", "Final count of the previous window: the offered load, in packets.")
	currentTierDesc   = metric("current_tier", "Tier of the latest selected packet of the current window (0 below the first threshold).")
	windowsOpenedDesc = metric("windows_opened_total", "Windows opened since the maps were created.")
	policyMaxDesc     = metric("policy_max_packets", "The policy's max: selected packets per window the host is meant to handle.")
	// Their twins under count: bytes (docs/design.md §5): the same counts
	// in bytes of payload; a policy exports one of the two.
	windowBytesDesc        = metric("window_bytes", "Payload bytes of selected packets counted in the current window (count: bytes); 0 once it has expired.")
	lastWindowBytesDesc    = metric("last_window_bytes", "Final count of the previous window under count: bytes: the offered load, in payload bytes.")
	policyMaxBytesDesc     = metric("policy_max_bytes", "The policy's max under count: bytes: payload bytes of selected packets per window the host is meant to handle.")
	tierThresholdBytesDesc = metric("policy_tier_threshold_bytes", "First byte count n of each tier (T_k) under count: bytes, as the compiled table applies it.", "tier")
	passedBytesDesc        = metric("passed_bytes_total", "Payload bytes (UDP or TCP payload: what the collector's socket receives) of selected packets passed: "+
		"pass and would_drop verdicts, over budget or not, and under count: bytes the TCP segments counted and never shed.")
	droppedBytesDesc  = metric("dropped_bytes_total", "Payload bytes of selected packets dropped (tiers and over budget).")
	policyModeDesc    = metric("policy_mode", "1 for the policy's mode (enforce, dry-run, off), 0 for the others.", "mode")
	tierThresholdDesc = metric("policy_tier_threshold_packets", "First packet count n of each tier (T_k), as the compiled table applies it.", "tier")
	tierDropDesc      = metric("policy_tier_drop_ratio", "Drop ratio (0..1) of each tier.", "tier")
)

// collectTiers emits the packet counters by tier and verdict, the
// unselected, exempt, fragment and malformed counters, and the window.
func collectTiers(ch chan<- prometheus.Metric, s Snapshot) {
	for t := range s.Stats.Selected {
		// Every tier of the policy, and any tier an earlier policy
		// counted in: counters never vanish.
		if t > len(s.Policy.Bounds) && s.Stats.Selected[t] == [bpf.NumVerdicts]bpf.Counter{} {
			continue
		}
		tier := strconv.Itoa(t)
		for _, v := range tiers.Verdicts {
			counter(ch, selectedPacketsDesc, s.Stats.Selected[t][v].Packets, tier, v.String())
			counter(ch, selectedBytesDesc, s.Stats.Selected[t][v].Bytes, tier, v.String())
		}
	}
	counter(ch, unselectedDesc, s.Stats.Unselected.Packets)
	counter(ch, exemptDesc, s.Stats.Exempt.Packets)
	counter(ch, fragmentsDesc, s.Stats.FragmentPass.Packets, "pass")
	counter(ch, fragmentsDesc, s.Stats.FragmentDrop.Packets, "drop")
	for _, m := range tiers.MalformedReasons {
		counter(ch, malformedDesc, s.Stats.Malformed[m].Packets, m.String())
	}
	for _, u := range tiers.UnclassifiedReasons {
		counter(ch, unclassifiedDesc, s.Stats.Unclassified[u].Packets, u.String())
	}
	counter(ch, passedBytesDesc, s.Stats.PassedBytes())
	counter(ch, droppedBytesDesc, s.Stats.Payload[tiers.VerdictDrop].Bytes)
	window, last := windowPacketsDesc, lastWindowDesc
	if s.Policy.Count == tiers.CountBytes {
		window, last = windowBytesDesc, lastWindowBytesDesc
	}
	gauge(ch, window, float64(s.WindowPackets))
	gauge(ch, last, float64(s.LastWindowPackets))
	gauge(ch, currentTierDesc, float64(s.CurrentTier))
	counter(ch, windowsOpenedDesc, s.WindowsOpened)
}

// collectPolicy emits the active policy: max, mode, and each tier's
// threshold and drop ratio.
func collectPolicy(ch chan<- prometheus.Metric, s Snapshot) {
	maxDesc, thrDesc := policyMaxDesc, tierThresholdDesc
	if s.Policy.Count == tiers.CountBytes {
		maxDesc, thrDesc = policyMaxBytesDesc, tierThresholdBytesDesc
	}
	gauge(ch, maxDesc, float64(s.Policy.Max))
	for _, m := range []tiers.Mode{tiers.ModeEnforce, tiers.ModeDryRun, tiers.ModeOff} {
		v := 0.0
		if m == s.Policy.Mode {
			v = 1
		}
		gauge(ch, policyModeDesc, v, m.String())
	}
	for t := 0; t <= len(s.Policy.Bounds) && t < len(s.Policy.DropRatios); t++ {
		tier := strconv.Itoa(t)
		if t > 0 {
			gauge(ch, thrDesc, float64(s.Policy.Bounds[t-1]), tier)
		}
		gauge(ch, tierDropDesc, s.Policy.DropRatios[t], tier)
	}
}
