// The window's counts, read and written from Go (bpf/window.h holds the
// program's side).

package bpf

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/tiers"
)

// Window reads the window state. Count and LastCount are exact: the shared
// count plus what every CPU counted in its overflow slot for the current and
// the previous window.
func (l *Limiter) Window() (Window, error) {
	var w LimiterTlWindow
	if err := l.objs.Window.Lookup(uint32(0), &w); err != nil {
		return Window{}, fmt.Errorf("read window: %w", err)
	}
	ov, err := l.overflowSlots()
	if err != nil {
		return Window{}, err
	}
	cur, curEx := overflowOf(ov, w.Opened)
	var prev, prevEx uint64
	if w.Opened > 0 {
		prev, prevEx = overflowOf(ov, w.Opened-1)
	}
	debt := w.Debt
	if int64(debt) < 0 { // an add and its undo in flight
		debt = 0
	}
	start := w.StartTick
	if l.tickNs == 0 && w.StartJiffies != 0 {
		// Opened under the tick gate before a restart switched to the
		// clock: the program reads it so (window.h window_start_tick).
		start = tiers.StartTick(w.StartNs, w.StartJiffies, false)
	}
	return Window{
		StartNs: w.StartNs, Count: w.Count + cur, LastCount: w.LastCount + prev,
		Opened: w.Opened, StartJiffies: w.StartJiffies, Overflow: cur, Debt: debt,
		Gap: w.Gap, Onset: w.Opened > 0 && w.Onset == w.Opened+1,
		StartTick: start, Ex: w.ExCount + curEx, LastEx: w.PrevEx + prevEx,
	}, nil
}

// overflowSlots reads the overflow map's slots of the possible CPUs.
func (l *Limiter) overflowSlots() ([]LimiterTlOverflow, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("count possible CPUs: %w", err)
	}
	ov := make([]LimiterTlOverflow, min(cpus, maxCPUs))
	for cpu := range ov {
		if err := l.objs.Overflow.Lookup(uint32(cpu), &ov[cpu]); err != nil {
			return nil, fmt.Errorf("read overflow of cpu %d: %w", cpu, err)
		}
	}
	return ov, nil
}

// overflowOf sums the packets the CPUs counted for the window with this
// id: in budget (n) and over (ex).
func overflowOf(ov []LimiterTlOverflow, id uint64) (n, ex uint64) {
	for _, o := range ov {
		if o.Window[id&1] == id {
			n, ex = n+o.Packets[id&1], ex+o.Ex[id&1]
		}
	}
	return n, ex
}

// put writes w's settable fields into the map's value v: the one
// conversion from a Window to the map (SetWindow, a migration's carried
// window, OpenPinned's view of an older layout's window); Window reads it
// back.
func (w Window) put(v *LimiterTlWindow) {
	v.StartNs, v.Count, v.LastCount, v.Opened, v.StartJiffies, v.Debt = w.StartNs, w.Count, w.LastCount, w.Opened, w.StartJiffies, w.Debt
}

// Counts is w for tiers.WindowNow.
func (w Window) Counts() tiers.WindowCounts {
	return tiers.WindowCounts{StartNs: w.StartNs, Count: w.Count, LastCount: w.LastCount, Opened: w.Opened, Debt: w.Debt, Gap: w.Gap, Onset: w.Onset, StartTick: w.StartTick}
}

// initWindow makes a window that never opened (fresh maps: the map's value
// all zero) read as expired, so that the first selected packet opens the
// first window, as the seed's rule and the model (tiers/model) have it. A
// zero start_ns is the clock's 0, the boot: on a host up for less than a
// window (tiers.MaxWindow is an hour), the program would count from load
// into a window that began at boot and ends at uptime = window, shorter than
// a window from the first packet. start_ns is put MaxWindow and 1 ns before
// now (wrapping below 0 early in boot: window.h compares the difference
// signed, so it reads as more than any window either way); start_jiffies
// stays 0, so the tick gate reads the clock. A window the program has
// counted in (pinned maps reused) is left as it is.
func (l *Limiter) initWindow() error {
	var v LimiterTlWindow
	if err := l.objs.Window.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("read window: %w", err)
	}
	if v != (LimiterTlWindow{}) {
		return nil
	}
	now, err := MonotonicNow()
	if err != nil {
		return err
	}
	v.StartNs = now - uint64(tiers.MaxWindow) - 1
	if err := l.objs.Window.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("write window: %w", err)
	}
	return nil
}

// SetWindow overwrites the window state, for tests and tools that preload
// a count: Count goes on the shared count, and every CPU's overflow slot is
// cleared. Racing packets may be lost; do not use it under traffic.
func (l *Limiter) SetWindow(w Window) error {
	keys := make([]uint32, maxCPUs)
	for cpu := range keys {
		keys[cpu] = uint32(cpu)
	}
	if err := putAll(l.objs.Overflow, keys, make([]LimiterTlOverflow, maxCPUs)); err != nil {
		return fmt.Errorf("clear overflow: %w", err)
	}
	// The smooth shape's and the budgets' fields of the window (its start
	// tick, gap, expected in-budget count, onset, over-budget counts) are
	// kept as they are: Window does not expose them to be set.
	var v LimiterTlWindow
	if err := l.objs.Window.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("read window: %w", err)
	}
	w.put(&v)
	v.Overflowed = 0
	if err := l.objs.Window.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("write window: %w", err)
	}
	return nil
}
