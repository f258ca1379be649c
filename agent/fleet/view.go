package fleet

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// ViewLimiter is a Limiter whose view expires (docs/design.md §12, "A view
// that expires"): *bpf.Limiter has it. A controller given one writes, with
// the others' sums, the time they hold until on CLOCK_MONOTONIC in ns (the
// answer's time + ttl); past it the program judges alone on the fallback
// the agent wrote (bpf.Limiter.SetFleetFallback), whether or not an agent
// still runs. viewForever never expires; 0 has expired.
type ViewLimiter interface {
	Limiter
	SetFleetView(in, total, expiry uint64) error
}

// viewForever is an expiry that never comes (bpf.ViewForever).
const viewForever = ^uint64(0)

// Viewer is a Fallback told, at each report answered, the member count
// the store returned and, with fallback last, the member's share of
// fleet.max then (tiers.FleetLastShare; 0 once it has decayed to share):
// the agent writes from them the fallback the program applies alone, and
// applies the last share, or share's max once it decays, when in
// fallback (the agent's fleetSide has it). Called from the report loop,
// before EnterFallback, and when the last share decays, FleetLastHold ×
// ttl after the member entered fallback.
type Viewer interface {
	View(members int, last uint64) error
}

// monoNow is CLOCK_MONOTONIC in ns, the program's bpf_ktime_get_ns; 0 if
// it cannot be read (an expiry of 0 has expired: the safe side).
func monoNow() uint64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return uint64(ts.Nano())
}

// writeView hands the others' sums to the program with their expiry when
// the Limiter takes one, else as they are (they then never expire).
func (c *Controller) writeView(others Sums, expiry uint64) {
	var err error
	if v, ok := c.lim.(ViewLimiter); ok {
		err = v.SetFleetView(others.In, others.Total, expiry)
	} else {
		err = c.lim.SetFleetOthers(others.In, others.Total)
	}
	if err != nil {
		if !c.setFailed {
			c.log.Error("write the others' sum to the program", "err", err)
			c.setFailed = true
		}
		return
	}
	c.setFailed = false
}

// viewed tells the agent (a Viewer) the member count and, with fallback
// last, the last share, when either changed.
func (c *Controller) viewed(members int, last uint64) {
	if members == c.toldMembers && last == c.toldLast && c.told {
		return
	}
	v, ok := c.fb.(Viewer)
	if !ok {
		return
	}
	if err := v.View(members, last); err != nil {
		c.log.Error("fleet: write the fallback the program applies alone", "err", err)
		return
	}
	c.told, c.toldMembers, c.toldLast = true, members, last
}

// lastShare is fallback last's share after a report answered with own
// estimates est and the others' sums others (tiers.FleetLastShare); 0
// for the other fallbacks.
func lastShare(cfg *Config, est, others Sums) uint64 {
	if cfg.Fallback != FallbackLast {
		return 0
	}
	return tiers.FleetLastShare(est.Total, est.Total+others.Total, cfg.Max)
}

// decay ends fallback last's hold: FleetLastHold × ttl after the member
// entered fallback its last share decays to share.
func (c *Controller) decay(now time.Time, cfg *Config) {
	if !c.inFallback || c.toldLast == 0 || now.Sub(c.fallbackSince) < tiers.FleetLastHold*cfg.TTL {
		return
	}
	c.log.Warn("fleet store still out of reach: fallback last's share decays to share", "held", now.Sub(c.fallbackSince),
		"members_last_seen", c.members)
	c.viewed(c.members, 0)
	c.writeView(Sums{}, viewForever)
}

// fallbackExpiry is the view written on entering fallback: others 0, held
// for fallback last until its share decays (then the program applies
// share's max alone), else forever (the fallback policy is the fallback).
func (c *Controller) fallbackExpiry(now uint64, cfg *Config) uint64 {
	if cfg.Fallback == FallbackLast && c.toldLast != 0 {
		return now + uint64(tiers.FleetLastHold*cfg.TTL)
	}
	return viewForever
}
