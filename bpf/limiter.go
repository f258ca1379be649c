// Package bpf holds the tierlimit XDP program (limiter.c), its bpf2go
// bindings, and the small API that loads it, writes a compiled policy into
// its maps and reads its counters back. The agent and the tests share this
// one path to the kernel.
//
// The program needs Linux >= 5.12 (BPF atomics with -mcpu=v3, bounded
// loops, bpf_jiffies64) built with CONFIG_BPF_SYSCALL and CONFIG_BPF_JIT;
// loading needs CAP_BPF and CAP_NET_ADMIN (root).
package bpf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/tiers"
)

// Limits compiled into the program; they mirror bpf/consts.h.
const (
	// MaxTiers is the most tiers a policy may have (consts.h TL_MAX_TIERS).
	MaxTiers = 16
	// TableMax is the most entries of one compiled table (TL_TABLE_MAX).
	TableMax = 1 << 20
	// MaxRules is the most select rules (TL_MAX_RULES).
	MaxRules = 32
	// Verdicts is the number of verdicts per tier in the stats map.
	Verdicts = tiers.NumVerdicts
)

// Indexes of the misc_stats map (types.h enum tl_misc).
const (
	miscUnselected = 0
	miscExempt     = 1
	miscFragPass   = 2
	miscFragDrop   = 3
	miscMax        = 4
)

// tl_port flags and tl_settings flags (types.h).
const (
	portPackets = 1
	portSYN     = 2
	hasExempt   = 1
)

// slotGrace is how long Apply waits after a slot stopped being active before
// it overwrites that slot. A packet reads active_slot once and finishes in
// well under a microsecond, so a packet still on the old slot is long gone.
const slotGrace = 20 * time.Millisecond

// Options configure Load.
type Options struct {
	// PinPath, when set, is a bpffs directory: maps are pinned there by name
	// and maps already pinned there are reused, so the window and counters
	// survive a reload of the program. Empty means no pinning.
	PinPath string
	// TickNs is the kernel's tick (1/CONFIG_HZ) in ns, from KernelTick. It
	// enables the program's tick gate, which skips bpf_ktime_get_ns for
	// packets that cannot be at a window's end (limiter.c window_count).
	// 0 disables the gate: every selected packet reads the clock.
	TickNs uint64
}

// Limiter is the loaded XDP program and its maps.
type Limiter struct {
	objs LimiterObjects
	// exempt and dests mirror the LPM tries, so that Apply writes only
	// the prefixes that changed.
	exempt, dests lpmMirror
	tickNs        uint64
	lastFlip      time.Time
	lastSlot      uint32
	hasPolicy     bool
}

// ErrPolicy is returned by Apply for a policy or table that the program
// cannot hold (too many tiers, rules or table entries).
var ErrPolicy = errors.New("policy does not fit the program")

// Load loads the program and creates (or, with PinPath, reuses) its maps.
// Nothing is attached.
func Load(opts Options) (*Limiter, error) {
	spec, err := LoadLimiter()
	if err != nil {
		return nil, fmt.Errorf("load limiter spec: %w", err)
	}
	var copts ebpf.CollectionOptions
	if opts.PinPath != "" {
		for _, m := range spec.Maps {
			if m.Name == "" || m.Name[0] == '.' {
				continue
			}
			m.Pinning = ebpf.PinByName
		}
		copts.Maps.PinPath = opts.PinPath
	}
	l := &Limiter{tickNs: opts.TickNs}
	if err := spec.LoadAndAssign(&l.objs, &copts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load limiter: %+v", verr)
		}
		return nil, fmt.Errorf("load limiter: %w", err)
	}
	return l, nil
}

// Program is the XDP program, to attach or to run with BPF_PROG_TEST_RUN.
func (l *Limiter) Program() *ebpf.Program { return l.objs.Tierlimit }

// Close releases the program and the maps (pinned maps stay pinned).
func (l *Limiter) Close() error { return l.objs.Close() }

// Apply writes policy p, compiled into t by tiers.Compile, into the inactive
// slot and then makes that slot active with one 4-byte map update, so that
// every packet sees either the whole old policy or the whole new one. The
// window and the counters carry on. Returns ErrPolicy when p or t exceed the
// program's limits; on any error the active policy is unchanged.
func (l *Limiter) Apply(p tiers.Policy, t tiers.Table) error {
	return l.ApplyContext(context.Background(), p, t)
}

// ApplyContext is Apply that gives up, returning ctx's error, when ctx ends
// before the new policy is active: the running policy stays, whole. Only
// prefix writes take long (about 20 µs each), so ctx is checked between
// them.
func (l *Limiter) ApplyContext(ctx context.Context, p tiers.Policy, t tiers.Table) error {
	if err := fits(p, t); err != nil {
		return err
	}
	active, err := l.activeSlot()
	if err != nil {
		return err
	}
	slot := active ^ 1
	// The slot we are about to write was active until the last flip.
	if l.hasPolicy && l.lastSlot == active {
		if wait := slotGrace - time.Since(l.lastFlip); wait > 0 {
			time.Sleep(wait)
		}
	}

	if err := l.writeTable(slot, t); err != nil {
		return err
	}
	synRules, err := l.writeSelectors(ctx, slot, p)
	if err != nil {
		return err
	}
	set := LimiterTlSettings{
		WindowNs: uint64(p.Window.Nanoseconds()),
		// Whole ticks in a window: the tick gate's bound.
		WindowJiffies: l.windowJiffies(p.Window),
		TableLen:      uint32(len(t.Thresholds)),
		Shift:         uint32(t.Shift),
		Mode:          uint32(p.Mode),
		SynRules:      synRules,
		Tiers:         uint32(len(p.Tiers)),
		Max:           p.Max,
	}
	if len(p.Exempt) > 0 {
		set.Flags |= hasExempt
	}
	if err := l.objs.Settings.Put(slot, &set); err != nil {
		return fmt.Errorf("write settings of slot %d: %w", slot, err)
	}
	if err := l.objs.ActiveSlot.Put(uint32(0), slot); err != nil {
		return fmt.Errorf("activate slot %d: %w", slot, err)
	}
	l.lastFlip, l.lastSlot, l.hasPolicy = time.Now(), slot, true
	return nil
}

func (l *Limiter) windowJiffies(w time.Duration) uint64 {
	if l.tickNs == 0 {
		return 0
	}
	return uint64(w.Nanoseconds()) / l.tickNs
}

func fits(p tiers.Policy, t tiers.Table) error {
	switch {
	case len(p.Tiers) > MaxTiers:
		return fmt.Errorf("%w: %d tiers, at most %d", ErrPolicy, len(p.Tiers), MaxTiers)
	case len(p.Select) > MaxRules:
		return fmt.Errorf("%w: %d select rules, at most %d", ErrPolicy, len(p.Select), MaxRules)
	case len(t.Thresholds) == 0 || len(t.Thresholds) > TableMax:
		return fmt.Errorf("%w: table of %d entries, want 1..%d", ErrPolicy, len(t.Thresholds), TableMax)
	case len(t.Tiers) != len(t.Thresholds):
		return fmt.Errorf("%w: table has %d tiers for %d thresholds", ErrPolicy, len(t.Tiers), len(t.Thresholds))
	case t.Shift > 63:
		return fmt.Errorf("%w: table step 2^%d", ErrPolicy, t.Shift)
	case len(p.Exempt) > tiers.MaxPrefixes:
		return fmt.Errorf("%w: %d exempt prefixes, at most %d", ErrPolicy, len(p.Exempt), tiers.MaxPrefixes)
	}
	dests := 0
	for _, r := range p.Select {
		dests += len(r.Dests)
	}
	if dests > tiers.MaxPrefixes {
		return fmt.Errorf("%w: %d dests prefixes, at most %d", ErrPolicy, dests, tiers.MaxPrefixes)
	}
	return nil
}

// activeSlot returns the slot (0 or 1) that packets currently read.
func (l *Limiter) activeSlot() (uint32, error) {
	var slot uint32
	if err := l.objs.ActiveSlot.Lookup(uint32(0), &slot); err != nil {
		return 0, fmt.Errorf("read active slot: %w", err)
	}
	return slot & 1, nil
}

func (l *Limiter) writeTable(slot uint32, t tiers.Table) error {
	keys := make([]uint32, len(t.Thresholds))
	vals := make([]LimiterTlEntry, len(t.Thresholds))
	base := slot * TableMax
	for i, thr := range t.Thresholds {
		keys[i] = base + uint32(i)
		vals[i] = LimiterTlEntry{Thr: thr, Tier: uint32(t.Tiers[i])}
	}
	if err := putAll(l.objs.TierTable, keys, vals); err != nil {
		return fmt.Errorf("write tier table of slot %d: %w", slot, err)
	}
	return nil
}

// Counter is a packet and byte count; bytes are L2 frame lengths.
type Counter struct {
	Packets uint64
	Bytes   uint64
}

func (c *Counter) add(s LimiterTlStat) {
	c.Packets += s.Packets
	c.Bytes += s.Bytes
}

// Stats are the program's counters summed over CPUs.
type Stats struct {
	// Selected is indexed by [tier][tiers.Verdict], tier 0..MaxTiers.
	Selected [MaxTiers + 1][Verdicts]Counter
	// Unselected counts packets passed without counting: not selected,
	// malformed, truncated or nested too deep.
	Unselected Counter
	// Exempt counts selected packets from exempt sources.
	Exempt Counter
	// FragmentPass and FragmentDrop count non-first fragments, which follow
	// the verdict of their first fragment.
	FragmentPass, FragmentDrop Counter
}

// SelectedTotal sums Selected over tiers for verdict v.
func (s *Stats) SelectedTotal(v tiers.Verdict) Counter {
	var c Counter
	for t := range s.Selected {
		c.Packets += s.Selected[t][v].Packets
		c.Bytes += s.Selected[t][v].Bytes
	}
	return c
}

// SelectedPackets sums Selected over tiers and verdicts: every selected
// packet counted in a window.
func (s *Stats) SelectedPackets() uint64 {
	var n uint64
	for _, v := range tiers.Verdicts {
		n += s.SelectedTotal(v).Packets
	}
	return n
}

// Stats reads and sums the per-CPU counters.
func (l *Limiter) Stats() (Stats, error) {
	var st Stats
	var per []LimiterTlStat
	for t := range st.Selected {
		for v := range Verdicts {
			if err := l.objs.Stats.Lookup(uint32(t*Verdicts+v), &per); err != nil {
				return Stats{}, fmt.Errorf("read stats[%d][%d]: %w", t, v, err)
			}
			for _, s := range per {
				st.Selected[t][v].add(s)
			}
		}
	}
	misc := [miscMax]*Counter{&st.Unselected, &st.Exempt, &st.FragmentPass, &st.FragmentDrop}
	for i, c := range misc {
		if err := l.objs.MiscStats.Lookup(uint32(i), &per); err != nil {
			return Stats{}, fmt.Errorf("read misc_stats[%d]: %w", i, err)
		}
		for _, s := range per {
			c.add(s)
		}
	}
	return st, nil
}

// Window is the shared window's state.
type Window struct {
	// StartNs is the clock (CLOCK_MONOTONIC, ns) of the packet that opened the window.
	StartNs uint64
	// Count is n of the latest selected packet: packets in this window.
	Count uint64
	// LastCount is the final n of the previous window.
	LastCount uint64
	// Opened counts the windows opened since the maps were created.
	Opened uint64
	// StartJiffies is bpf_jiffies64 when the window opened. SetWindow with
	// 0 makes the next packets read the clock until a window opens.
	StartJiffies uint64
}

// Window reads the window state.
func (l *Limiter) Window() (Window, error) {
	var w LimiterTlWindow
	if err := l.objs.Window.Lookup(uint32(0), &w); err != nil {
		return Window{}, fmt.Errorf("read window: %w", err)
	}
	return Window{StartNs: w.StartNs, Count: w.Count, LastCount: w.LastCount, Opened: w.Opened, StartJiffies: w.StartJiffies}, nil
}

// SetWindow overwrites the window state, for tests and tools that preload
// a count. Racing packets may be lost; do not use it under traffic.
func (l *Limiter) SetWindow(w Window) error {
	v := LimiterTlWindow{StartNs: w.StartNs, Count: w.Count, LastCount: w.LastCount, Opened: w.Opened, StartJiffies: w.StartJiffies}
	if err := l.objs.Window.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("write window: %w", err)
	}
	return nil
}

// Active is the policy in force, as the program's maps hold it.
type Active struct {
	// Mode is the mode (tiers.Mode).
	Mode tiers.Mode
	// Window is the window length.
	Window time.Duration
	// Max is the policy's max, packets per window.
	Max uint64
	// Bounds are the first n of tiers 1..K as the table applies them: T_k,
	// rounded up to the table's step when Shift > 0.
	Bounds []uint64
	// DropRatios of tiers 0..K, 0..1, on the bpf_get_prandom_u32 scale.
	DropRatios []float64
	// TableLen and Shift describe the table: entry i covers n>>Shift == i.
	TableLen int
	Shift    uint
}

// Active reads the active slot's settings and table. Returns ErrPolicy when
// no policy has been applied.
func (l *Limiter) Active() (Active, error) {
	slot, err := l.activeSlot()
	if err != nil {
		return Active{}, err
	}
	var set LimiterTlSettings
	if err := l.objs.Settings.Lookup(slot, &set); err != nil {
		return Active{}, fmt.Errorf("read settings: %w", err)
	}
	if set.TableLen == 0 {
		return Active{}, fmt.Errorf("%w: no policy applied", ErrPolicy)
	}
	a := Active{
		Mode:       tiers.Mode(set.Mode),
		Window:     time.Duration(set.WindowNs),
		Max:        set.Max,
		TableLen:   int(set.TableLen),
		Shift:      uint(set.Shift),
		Bounds:     make([]uint64, set.Tiers),
		DropRatios: make([]float64, set.Tiers+1),
	}
	base := slot * TableMax
	entry := func(i uint32) (LimiterTlEntry, error) {
		var e LimiterTlEntry
		err := l.objs.TierTable.Lookup(base+i, &e)
		return e, err
	}
	// The table is monotone in tier: find where each tier starts by
	// binary search, about 20 lookups per tier.
	for k := 0; k <= int(set.Tiers); k++ {
		lo, hi := uint32(0), set.TableLen // first i with tier >= k is in [lo, hi]
		for lo < hi {
			mid := lo + (hi-lo)/2
			e, err := entry(mid)
			if err != nil {
				return Active{}, fmt.Errorf("read tier table: %w", err)
			}
			if int(e.Tier) >= k {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		if k > 0 {
			a.Bounds[k-1] = uint64(lo) << set.Shift
		}
		if lo == set.TableLen {
			a.DropRatios[k] = 0 // unreachable: no entry in this tier or above
			continue
		}
		e, err := entry(lo)
		if err != nil {
			return Active{}, fmt.Errorf("read tier table: %w", err)
		}
		if int(e.Tier) == k {
			// thr = round(p·2^32) is within 2^-33 of p: 9 decimals give
			// back the configured ratio.
			a.DropRatios[k] = math.Round(tiers.DropRatio(e.Thr)*1e9) / 1e9
		}
	}
	return a, nil
}
