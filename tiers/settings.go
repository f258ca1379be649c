package tiers

import "time"

// Settings is what the program's settings map gets of a policy besides
// the tier table and the selectors (bpf/types.h struct tl_settings), all
// derived here, once, from the policy and the kernel's tick: package bpf
// writes it as it is and derives nothing.
type Settings struct {
	// TickNs is the tick the settings were compiled for: the kernel's
	// jiffy in ns where the program has its tick gate (bpf.MeasureTick),
	// 0 where every selected packet reads the clock.
	TickNs uint64
	// Mode and Window are the policy's, Max the max its table is
	// compiled for (Policy.TableMax: fleet.max under a fleet).
	Mode   Mode
	Window time.Duration
	Max    uint64
	// WindowTicks is the whole ticks in a window, the tick gate's bound
	// (window.h); 0 without the tick gate.
	WindowTicks uint64
	// SmoothTicks is the ticks of a window as the smooth estimate counts
	// them (docs/design.md §9, smooth.h): WindowTicks under the tick gate, else
	// Window >> SmoothTickShift; at least 1.
	SmoothTicks uint64
	// TierStarts[k-1] is TierStart(k) for tiers 1..K: the first n of each
	// tier as the table applies it. LastN is that of the last tier, where
	// the saturated window's fast path starts (window.h window_count).
	TierStarts []uint64
	LastN      uint64
	// HasExempt is set when the policy exempts sources.
	HasExempt bool
	// Bytes is set when the policy counts bytes (count: bytes): each
	// selected datagram weighs its UDP payload length, not 1
	// (docs/design.md §2), and every count above is in bytes.
	Bytes bool
	// Rules, Dests and LocalDests count the select rules, their dests
	// prefixes and their local destinations, and Exempts the exempt
	// prefixes: what the program's limits bound (bpf.ErrPolicy).
	Rules, Dests, LocalDests, Exempts int
	// LocalBudget is the most local destinations the destination trie
	// holds beside the dests prefixes (LocalBudget).
	LocalBudget int
}

// SmoothTick is the tick of the smooth estimate in ns for the kernel's
// tick tickNs (Settings.TickNs): the jiffy under the tick gate, else
// 1 << SmoothTickShift (model.Model.SetTick, bpf.Limiter.TickNs).
func SmoothTick(tickNs uint64) uint64 {
	if tickNs == 0 {
		return 1 << SmoothTickShift
	}
	return tickNs
}

// compileSettings derives the settings of a valid policy p compiled into
// t, for the kernel's tick tickNs.
func compileSettings(p Policy, t Table, tickNs uint64) Settings {
	s := Settings{TickNs: tickNs, Mode: p.Mode, Window: p.Window, Max: p.TableMax(),
		HasExempt: len(p.Exempt) > 0, Bytes: p.Count == CountBytes, Rules: len(p.Select), Exempts: len(p.Exempt), LocalBudget: LocalBudget(p)}
	if tickNs != 0 {
		s.WindowTicks = uint64(p.Window.Nanoseconds()) / tickNs
	}
	s.SmoothTicks = max(s.WindowTicks, 1)
	if s.WindowTicks == 0 {
		s.SmoothTicks = max(uint64(p.Window.Nanoseconds())>>SmoothTickShift, 1)
	}
	s.TierStarts = make([]uint64, len(t.Bounds))
	for k := range t.Bounds {
		s.TierStarts[k] = t.TierStart(k + 1)
	}
	s.LastN = t.TierStart(len(t.Bounds))
	for _, r := range p.Select {
		s.Dests += len(r.Dests)
		s.LocalDests += len(r.LocalDests)
	}
	return s
}
