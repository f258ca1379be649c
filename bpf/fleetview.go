package bpf

import (
	"fmt"
	"math"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// ViewForever is an expiry of SetFleetView that never comes: the sums hold
// until the next write.
const ViewForever = math.MaxUint64

// SetFleetView writes the others' sums as SetFleetOthers does, and the time
// they hold until, expiry, on CLOCK_MONOTONIC in ns (bpf_ktime_get_ns's
// clock: MonotonicNow() + ttl at a report answered; ViewForever never
// expires). Past expiry the program judges alone on the fallback the last
// SetFleetFallback wrote, with no agent running (docs/design.md §12, "A
// view that expires"; fleet.h): the sums then count for nothing. An expiry
// at or before now is expired from the next tick on. The sums are written
// first, then the expiry, then the stale mark is cleared, so that no packet
// reads a fresh expiry with the old sums. Returns ErrPolicy when the
// loaded object has no view (an earlier build).
func (l *Limiter) SetFleetView(in, total, expiry uint64) error {
	if l.objs.TlFleetExpiry == nil || l.objs.TlFleetStale == nil {
		return fmt.Errorf("%w: the loaded object has no fleet view", ErrPolicy)
	}
	if err := l.setSums(in, total); err != nil {
		return err
	}
	return l.setExpiry(expiry)
}

// setExpiry writes tl_fleet_expiry and the stale mark it implies now.
func (l *Limiter) setExpiry(expiry uint64) error {
	if err := l.objs.TlFleetExpiry.Set(expiry); err != nil {
		return fmt.Errorf("set tl_fleet_expiry: %w", err)
	}
	stale := uint32(0)
	if now, err := MonotonicNow(); err != nil {
		return err
	} else if now >= expiry {
		stale = 1
	}
	if err := l.objs.TlFleetStale.Set(stale); err != nil {
		return fmt.Errorf("set tl_fleet_stale: %w", err)
	}
	return nil
}

// SetFleetFallback writes the fallback the program applies alone past the
// view's expiry (fleet.h): mult, the table max over the fallback's max on
// 2^16 (tiers.FleetFallbackMult; tiers.SmoothOne, 65536, for none), at most
// tiers.FleetMultMax. Returns ErrPolicy for a mult of 0 or over the most,
// or when the loaded object has no view.
func (l *Limiter) SetFleetFallback(mult uint64) error {
	if l.objs.TlFleetFbMult == nil {
		return fmt.Errorf("%w: the loaded object has no fleet view", ErrPolicy)
	}
	if mult == 0 || mult > tiers.FleetMultMax {
		return fmt.Errorf("%w: fleet fallback multiplier %d: want 1 to %d", ErrPolicy, mult, uint64(tiers.FleetMultMax))
	}
	if err := l.objs.TlFleetFbMult.Set(mult); err != nil {
		return fmt.Errorf("set tl_fleet_fb_mult: %w", err)
	}
	return nil
}

// FleetView reads back the view's expiry, the fallback's multiplier and
// whether the program last found the view expired (tl_fleet_stale, set at
// a CPU's refresh, once per tick).
func (l *Limiter) FleetView() (expiry, mult uint64, stale bool, err error) {
	if l.objs.TlFleetExpiry == nil || l.objs.TlFleetFbMult == nil || l.objs.TlFleetStale == nil {
		return 0, 0, false, fmt.Errorf("%w: the loaded object has no fleet view", ErrPolicy)
	}
	var s uint32
	if err := l.objs.TlFleetExpiry.Get(&expiry); err != nil {
		return 0, 0, false, fmt.Errorf("read tl_fleet_expiry: %w", err)
	}
	if err := l.objs.TlFleetFbMult.Get(&mult); err != nil {
		return 0, 0, false, fmt.Errorf("read tl_fleet_fb_mult: %w", err)
	}
	if err := l.objs.TlFleetStale.Get(&s); err != nil {
		return 0, 0, false, fmt.Errorf("read tl_fleet_stale: %w", err)
	}
	return expiry, mult, s != 0, nil
}

// MonotonicNow returns CLOCK_MONOTONIC in ns: bpf_ktime_get_ns's clock,
// which SetFleetView's expiry is on.
func MonotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read the clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}
