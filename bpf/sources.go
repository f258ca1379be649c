package bpf

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/tiers"
)

// Per-source budgets (docs/design.md §6): the sketch's seeds, the over-budget
// counters and the table of groups over budget.

// SketchRows is the number of rows of the program's count-min sketch
// (TL_SKETCH_ROWS); tiers.SketchRows matches it.
const SketchRows = int(LimiterTlConstTL_C_SKETCH_ROWS)

// seedWords is the number of 64-bit hash seeds per sketch row.
const seedWords = int(LimiterTlConstTL_SEED_WORDS)

// initSeeds takes the sketch seeds from the active slot's settings of
// reused (pinned) maps, so that the current window's group counts stay
// valid across an agent restart, and draws new ones otherwise.
func (l *Limiter) initSeeds() error {
	if slot, err := l.activeSlot(); err == nil {
		var set LimiterTlSettings
		if err := l.objs.Settings.Lookup(slot, &set); err == nil && set.TableLen != 0 && set.SrcSeeds != [len(set.SrcSeeds)]uint64{} {
			l.seeds = set.SrcSeeds
			return nil
		}
	}
	var b [8 * len(l.seeds)]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("draw sketch seeds: %w", err)
	}
	for i := range l.seeds {
		l.seeds[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return nil
}

// SketchSeeds returns the seeds of the sketch rows, for the reference model
// (model.Model.SetSketchSeeds). They are drawn at Load, or taken over from
// pinned maps, and never change while the Limiter lives.
func (l *Limiter) SketchSeeds() tiers.SketchSeeds {
	var s tiers.SketchSeeds
	for r := range s {
		copy(s[r][:], l.seeds[r*tiers.SeedWords:])
	}
	return s
}

// setSources writes the compiled budget and the seeds into set.
func (l *Limiter) setSources(set *LimiterTlSettings, b tiers.SourceBudget) {
	set.SrcBudget = b.Budget
	set.SrcMask4 = b.Mask4
	set.SrcMask6 = b.Mask6
	set.SrcSeeds = l.seeds
	set.SrcPrefixV4 = uint32(b.PrefixV4)
	set.SrcPrefixV6 = uint32(b.PrefixV6)
}

// activeSources reads back what setSources wrote.
func activeSources(set *LimiterTlSettings) tiers.SourceBudget {
	return tiers.SourceBudget{
		Budget:   set.SrcBudget,
		PrefixV4: uint8(set.SrcPrefixV4),
		PrefixV6: uint8(set.SrcPrefixV6),
		Mask4:    set.SrcMask4,
		Mask6:    set.SrcMask6,
	}
}

// readOverBudget sums the per-CPU over-budget counters into st.OverBudget.
func (l *Limiter) readOverBudget(st *Stats) error {
	var per []LimiterTlStat
	for v := range NumVerdicts {
		if err := l.objs.SourceStats.Lookup(uint32(v), &per); err != nil {
			return fmt.Errorf("read source_stats[%d]: %w", v, err)
		}
		for _, s := range per {
			st.OverBudget[v].add(s)
		}
	}
	return nil
}

// SourceGroup is a source group that went over its budget.
type SourceGroup struct {
	// Group is the masked source address and the grouping prefix length.
	Group netip.Prefix
	// Packets counts its packets over budget, all windows and CPUs
	// together.
	Packets uint64
	// LastWindow is the id (Window.Opened) of the last window in which it
	// was over budget.
	LastWindow uint64
	// Windows counts the windows in which it went over budget, as the CPU
	// that saw it over budget in the most windows counted them: exact when
	// one CPU receives the group (RSS hashes a source to one queue unless
	// its ports vary), otherwise at least that.
	Windows uint64
}

// TopSources returns up to n groups from the program's table of groups
// over budget (an LRU that holds at least tiers.TopSources groups on any
// CPU count, sizeMaps: the groups over budget least recently are evicted
// first), most packets over budget first; n <= 0 returns all. A group's
// packets are its entry's plus each CPU's open run of it (sources.h
// source_top_add). The prefix
// lengths come from the active policy. Returns the map read's error when
// either table cannot be read.
func (l *Limiter) TopSources(n int) ([]SourceGroup, error) {
	var (
		k   LimiterTlSrcKey
		v   LimiterTlSrcTop
		out []SourceGroup
	)
	var b tiers.SourceBudget
	if a, err := l.Active(); err == nil {
		b = a.Sources
	} else if !errors.Is(err, ErrPolicy) {
		return nil, err
	}
	byKey := map[LimiterTlSrcKey]int{} // index in out
	it := l.objs.SourceTop.Iterate()
	for it.Next(&k, &v) {
		g := SourceGroup{Group: groupPrefix(k, b), Packets: v.Packets, LastWindow: v.LastWindow, Windows: v.Windows}
		byKey[k] = len(out)
		out = append(out, g)
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return nil, fmt.Errorf("read source_top: %w", err)
	}
	// Each CPU's open run: packets counted in source_run and not yet in
	// source_top. Read after source_top, so a run that ends in between is
	// missed once, never counted twice.
	var runs []LimiterTlSrcRun
	if err := l.objs.SourceRun.Lookup(uint32(0), &runs); err != nil {
		return nil, fmt.Errorf("read source_run: %w", err)
	}
	for _, r := range runs {
		if r.Packets == 0 || r.Key.Family == 0 {
			continue
		}
		i, ok := byKey[r.Key]
		if !ok { // evicted from source_top meanwhile
			i = len(out)
			byKey[r.Key] = i
			out = append(out, SourceGroup{Group: groupPrefix(r.Key, b), LastWindow: r.Window, Windows: 1})
		}
		out[i].Packets += r.Packets
		out[i].LastWindow = max(out[i].LastWindow, r.Window)
	}
	slices.SortFunc(out, func(a, b SourceGroup) int {
		if a.Packets != b.Packets {
			if a.Packets > b.Packets {
				return -1
			}
			return 1
		}
		return a.Group.Addr().Compare(b.Group.Addr())
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out, nil
}

// groupPrefix decodes a source_top key: words as the program loaded them
// from the header (little-endian loads of network-order bytes).
func groupPrefix(k LimiterTlSrcKey, b tiers.SourceBudget) netip.Prefix {
	var a [16]byte
	for i, w := range k.Addr {
		binary.LittleEndian.PutUint32(a[4*i:], w)
	}
	if k.Family == 4 {
		bits := int(b.PrefixV4)
		if bits == 0 {
			bits = 32
		}
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(a[:4])), bits)
	}
	bits := int(b.PrefixV6)
	if bits == 0 {
		bits = 128
	}
	return netip.PrefixFrom(netip.AddrFrom16(a), bits)
}

// SourceMemory returns the kernel memory (bytes) of the sketch (its size
// in the program's .bss, maps.h tl_sketch), the table of groups over
// budget and the CPUs' runs (memlock): fixed at load, whatever the
// traffic.
func (l *Limiter) SourceMemory() (uint64, error) {
	total := uint64(l.objs.TlSketch.Size())
	for _, m := range []*ebpf.Map{l.objs.SourceTop, l.objs.SourceRun} {
		info, err := m.Info()
		if err != nil {
			return 0, fmt.Errorf("read map info: %w", err)
		}
		b, ok := info.Memlock()
		if !ok {
			return 0, fmt.Errorf("map %s: memlock: %w", info.Name, ebpf.ErrNotSupported)
		}
		total += b
	}
	return total, nil
}

// lruLocalFree is the kernel LRU's LOCAL_FREE_TARGET (maps.h source_top).
const lruLocalFree = uint32(LimiterTlConstTL_C_LRU_LOCAL_FREE)

// sizeMaps sizes the maps whose size depends on the host: source_top holds
// tiers.TopSources groups plus lruLocalFree for each possible CPU and one
// more (maps.h says why). Load and CheckPinned both apply it, so a pinned
// table is reused on the host that made it.
func sizeMaps(spec *ebpf.CollectionSpec) error {
	m, ok := spec.Maps["source_top"]
	if !ok {
		return nil
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("count possible CPUs: %w", err)
	}
	m.MaxEntries = SourceTopEntries(cpus)
	return nil
}

// SourceTopEntries is source_top's size on a host with cpus possible CPUs.
func SourceTopEntries(cpus int) uint32 {
	return tiers.TopSources + lruLocalFree*uint32(cpus+1)
}
