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
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
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
	synRules, err := l.writeSelectors(slot, p)
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

// writeSelectors fills the slot's port array and LPM tries and returns the
// syn_rules mask. The port array is written whole, in two batches: the time
// is bounded (about 130k entries) whatever the number of ranges, since each
// rule's ranges are merged first.
func (l *Limiter) writeSelectors(slot uint32, p tiers.Policy) (uint32, error) {
	keys := make([]uint32, 2*numPorts)
	for i := range keys {
		keys[i] = slot*2*numPorts + uint32(i)
	}
	vals, synRules := portEntries(p)
	var dests []LimiterTlLpmKey
	for i, r := range p.Select {
		for _, d := range r.Dests {
			dests = append(dests, lpmKey(slot<<8|uint32(i), d))
		}
	}
	if err := putAll(l.objs.Ports, keys, vals); err != nil {
		return 0, fmt.Errorf("write ports of slot %d: %w", slot, err)
	}
	if err := l.dests.sync(l.objs.SelectDests, func(tag uint32) uint32 { return tag >> 8 }, slot, dests); err != nil {
		return 0, fmt.Errorf("write select dests of slot %d: %w", slot, err)
	}
	var exempt []LimiterTlLpmKey
	for _, e := range p.Exempt {
		exempt = append(exempt, lpmKey(slot, e))
	}
	if err := l.exempt.sync(l.objs.ExemptSources, func(tag uint32) uint32 { return tag }, slot, exempt); err != nil {
		return 0, fmt.Errorf("write exempt sources of slot %d: %w", slot, err)
	}
	return synRules, nil
}

// numPorts is the number of port entries per protocol.
const numPorts = 65536

// portEntries is one slot's port array: UDP ports, then TCP ports. Each
// rule's ranges are sorted and merged, so overlapping ranges cost nothing.
func portEntries(p tiers.Policy) ([]LimiterTlPort, uint32) {
	vals := make([]LimiterTlPort, 2*numPorts)
	var synRules uint32
	for i, r := range p.Select {
		half := 0
		if r.Proto == tiers.ProtoTCP {
			half = numPorts
		}
		for _, pr := range mergeRanges(r.Ports) {
			for port := int(pr.First); port <= int(pr.Last); port++ {
				v := &vals[half+port]
				switch {
				case len(r.Dests) > 0:
					v.CidrRules |= 1 << i
				case r.Count == tiers.CountSYN:
					v.Flags |= portSYN
				default:
					v.Flags |= portPackets
				}
			}
		}
		if len(r.Dests) > 0 && r.Count == tiers.CountSYN {
			synRules |= 1 << i
		}
	}
	return vals, synRules
}

// mergeRanges returns rs sorted by First with overlapping and adjacent
// ranges joined.
func mergeRanges(rs []tiers.PortRange) []tiers.PortRange {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b tiers.PortRange) int { return int(a.First) - int(b.First) })
	out := s[:0]
	for _, r := range s {
		if n := len(out); n > 0 && int(r.First) <= int(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// lpmKey encodes a prefix as the program looks it up: IPv4 as IPv4-mapped
// IPv6 (RFC 4291 §2.5.5.2), prefixlen counting the 32-bit tag.
func lpmKey(tag uint32, pfx netip.Prefix) LimiterTlLpmKey {
	pfx = pfx.Masked()
	bits := pfx.Bits()
	if pfx.Addr().Is4() {
		bits += 96
	}
	return LimiterTlLpmKey{Prefixlen: uint32(32 + bits), Tag: tag, Addr: pfx.Addr().As16()}
}

// lpmMirror is what an LPM trie holds, per slot. Iterating a trie costs
// tens of µs per key, so it is read once, on the first Apply after Load,
// and kept in step with every write after that.
type lpmMirror struct {
	loaded bool
	slots  [2]map[LimiterTlLpmKey]struct{}
}

// sync makes slot's keys in m (slotOf maps a tag to its slot) exactly
// want: it deletes the keys that are not wanted, then inserts the missing
// ones, so an unchanged policy costs no map write and the trie never holds
// more than both slots' policies.
func (mr *lpmMirror) sync(m *ebpf.Map, slotOf func(tag uint32) uint32, slot uint32, want []LimiterTlLpmKey) error {
	if !mr.loaded {
		if err := mr.load(m, slotOf); err != nil {
			return err
		}
	}
	have := mr.slots[slot&1]
	wantSet := make(map[LimiterTlLpmKey]struct{}, len(want))
	for _, k := range want {
		wantSet[k] = struct{}{}
	}
	for k := range have {
		if _, ok := wantSet[k]; ok {
			continue
		}
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		delete(have, k)
	}
	for _, k := range want {
		if _, ok := have[k]; ok {
			continue
		}
		if err := m.Put(&k, uint8(1)); err != nil {
			return fmt.Errorf("prefix %v/%d: %w", netip.AddrFrom16(k.Addr), k.Prefixlen-32, err)
		}
		have[k] = struct{}{}
	}
	return nil
}

func (mr *lpmMirror) load(m *ebpf.Map, slotOf func(tag uint32) uint32) error {
	mr.slots = [2]map[LimiterTlLpmKey]struct{}{{}, {}}
	var (
		k LimiterTlLpmKey
		v uint8
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		mr.slots[slotOf(k.Tag)&1][k] = struct{}{}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read LPM trie: %w", err)
	}
	mr.loaded = true
	return nil
}

// putAll writes an array map in batches, one element at a time where the
// kernel has no batch operations.
func putAll[V any](m *ebpf.Map, keys []uint32, vals []V) error {
	const chunk = 1 << 16
	for i := 0; i < len(keys); i += chunk {
		j := min(i+chunk, len(keys))
		_, err := m.BatchUpdate(keys[i:j], vals[i:j], nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			for x := i; x < j; x++ {
				if err := m.Put(keys[x], &vals[x]); err != nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return err
		}
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

// CheckPinned reports whether the maps pinned in dir, if any, are the ones
// Load with Options.PinPath = dir would reuse: same type, key and value
// sizes, size and flags. It writes nothing. Returns an error naming the
// first pinned map that differs; nil when none is pinned.
func CheckPinned(dir string) error {
	spec, err := LoadLimiter()
	if err != nil {
		return fmt.Errorf("load limiter spec: %w", err)
	}
	for name, ms := range spec.Maps {
		if name == "" || name[0] == '.' {
			continue
		}
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open pinned map %s: %w", path, err)
		}
		err = ms.Compatible(m)
		m.Close()
		if err != nil {
			return fmt.Errorf("pinned map %s: %w", name, err)
		}
	}
	return nil
}

// OpenPinned opens the maps pinned in dir by a Limiter loaded with
// Options.PinPath = dir, without loading the program: enough for Stats,
// Window and Active, as `tierlimit status` needs with no agent running.
// Program returns nil on the result; Apply must not be called.
func OpenPinned(dir string) (*Limiter, error) {
	l := &Limiter{}
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		return m, nil
	}
	for _, f := range l.namedMaps() {
		m, err := open(f.name)
		if err != nil {
			l.objs.Close()
			return nil, err
		}
		*f.dst = m
	}
	return l, nil
}

type namedMap struct {
	dst  **ebpf.Map
	name string
}

// namedMaps lists the maps with the names they are pinned under.
func (l *Limiter) namedMaps() []namedMap {
	return []namedMap{
		{&l.objs.ActiveSlot, "active_slot"}, {&l.objs.Settings, "settings"}, {&l.objs.TierTable, "tier_table"},
		{&l.objs.Ports, "ports"}, {&l.objs.ExemptSources, "exempt_sources"}, {&l.objs.SelectDests, "select_dests"},
		{&l.objs.Window, "window"}, {&l.objs.Stats, "stats"}, {&l.objs.MiscStats, "misc_stats"},
		{&l.objs.FragVerdicts, "frag_verdicts"},
	}
}

// Repin pins every map under dir by name again, as Load with
// Options.PinPath = dir does, replacing what is there: for pins removed
// from under a running limiter, whose maps live on in its fds.
func (l *Limiter) Repin(dir string) error {
	for _, f := range l.namedMaps() {
		m := *f.dst
		if err := m.Unpin(); err != nil {
			return fmt.Errorf("unpin map %s: %w", f.name, err)
		}
		if err := m.Pin(filepath.Join(dir, f.name)); err != nil {
			return fmt.Errorf("pin map %s: %w", f.name, err)
		}
	}
	return nil
}

// PinnedMaps reports whether every map is pinned under dir as this
// limiter's map (same map id).
func (l *Limiter) PinnedMaps(dir string) bool {
	for _, f := range l.namedMaps() {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, f.name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return false
		}
		a, _ := m.Info()
		m.Close()
		b, _ := (*f.dst).Info()
		if a == nil || b == nil {
			return false
		}
		ida, _ := a.ID()
		idb, _ := b.ID()
		if ida != idb {
			return false
		}
	}
	return true
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
