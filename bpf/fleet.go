package bpf

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// SetFleetOthers writes the sum of the other fleet members' last reported
// R̂ (docs/design.md §12), packets per window, into the program
// (maps.h tl_fleet_others): from the next packet on, the smooth shape
// judges on this member's own R̂ plus others, against the table the
// policy was compiled for (fleet.max, tiers.Policy.TableMax). A sum above
// tiers.MaxFleetOthers is written as that. 0 is the plain smooth shape,
// and what a loaded program starts with: the agent writes it at each
// report, and 0 when it leaves the fleet or applies a fallback policy.
// One aligned 8-byte store: a packet reads the old sum or the new one.
func (l *Limiter) SetFleetOthers(others uint64) error {
	if err := l.objs.TlFleetOthers.Set(min(others, tiers.MaxFleetOthers)); err != nil {
		return fmt.Errorf("set tl_fleet_others: %w", err)
	}
	return nil
}

// FleetOthers reads back the sum SetFleetOthers wrote.
func (l *Limiter) FleetOthers() (uint64, error) {
	var v uint64
	if err := l.objs.TlFleetOthers.Get(&v); err != nil {
		return 0, fmt.Errorf("read tl_fleet_others: %w", err)
	}
	return v, nil
}

// FleetEstimate returns this member's own live R̂ (docs/design.md §12),
// packets per window: the estimate that the program would judge a
// selected packet arriving now on, the packet itself and the others' sum
// left out (tiers.LiveEstimate, tiers.Model.EstimateAt), read from the
// window and the per-CPU overflow counts. It is what a member reports to
// the fleet. With per-source budgets it counts every selected packet, in
// and over budget: R̂_tot, on which over-budget packets are judged, since
// the others take the report as in-budget load and the fleet then passes
// no more than without budgets. Under the tick gate the ticks since the window opened are
// read from the clock (now − start_ns over the tick), within one tick of
// the program's jiffies. Returns ErrPolicy when no policy is applied.
func (l *Limiter) FleetEstimate() (uint64, error) {
	slot, err := l.activeSlot()
	if err != nil {
		return 0, err
	}
	var set LimiterTlSettings
	if err := l.objs.Settings.Lookup(slot, &set); err != nil {
		return 0, fmt.Errorf("read settings: %w", err)
	}
	if set.TableLen == 0 {
		return 0, fmt.Errorf("%w: no policy applied", ErrPolicy)
	}
	var w LimiterTlWindow
	if err := l.objs.Window.Lookup(uint32(0), &w); err != nil {
		return 0, fmt.Errorf("read window: %w", err)
	}
	if w.Opened == 0 {
		return 0, nil
	}
	ov, err := l.overflowSlots()
	if err != nil {
		return 0, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read the clock: %w", err)
	}
	now := uint64(ts.Nano())
	var cur, curEx, prev, prevEx uint64
	for _, o := range ov {
		if i := w.Opened & 1; o.Window[i] == w.Opened {
			cur, curEx = cur+o.Packets[i], curEx+o.Ex[i]
		}
		if i := (w.Opened - 1) & 1; o.Window[i] == w.Opened-1 {
			prev, prevEx = prev+o.Packets[i], prevEx+o.Ex[i]
		}
	}
	ticks := max(set.SmTicks, 1)
	// Since the window opened, ns: signed, as window.h window_expired
	// compares (a window backdated past the clock's zero wraps).
	since := max(int64(now-w.StartNs), 0)
	var elapsed uint64
	if set.WindowJiffies == 0 {
		tick := now >> tiers.SmoothTickShift
		elapsed = tick - min(tick, w.StartTick)
	} else {
		elapsed = uint64(since) / l.TickNs()
	}
	st := tiers.SmoothState{Elapsed: elapsed, Ticks: ticks, Gap: w.Gap,
		Prev: w.LastCount + prev + w.PrevEx + prevEx}
	n := w.Count + cur + w.ExCount + curEx
	expired := since > int64(set.WindowNs)
	return tiers.LiveEstimate(st, n, w.Onset == w.Opened+1, expired, elapsed-min(elapsed, ticks)), nil
}
