package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/tiers"
)

// Layout is the version of the pinned maps' layout this program reads and
// writes: every pinned map's name and spec and the meaning of every key
// and field (docs/design.md §11). Bump it whenever any of them changes;
// TestLayoutGolden fails until you do. Then say in carriedSince which maps
// keep their meaning, and in settingsPrefix whether the old settings read
// as a prefix of the new.
//
//	0  any state pinned before the layout was recorded (up to 90e44a6)
//	1  the smooth shape and budgets that share: smooth_cpu is new,
//	   tl_window, tl_overflow (ex) and tl_settings (shape, sm_*) grew
//	2  smooth_cpu grew (the in-budget rate's samples, the over-budget
//	   memo: issue 32); tl_settings is layout 1's; select_dests holds
//	   one entry per destination, whose u32 value is its rules (issue
//	   35 B46), and dest_cache that answer
//	3  smooth_prof is new (the profile of the in-budget count that the
//	   sliding count reads with budgets on) and smooth_cpu grew (the
//	   previous window's in-budget count, prev_in_all); every other map
//	   is layout 2's
//	4  smooth_cpu grew (the recent rate's counts of all selected packets,
//	   the onset's latch and origin: issue 39); every other map is
//	   layout 3's
//	5  bytes_stats is new (the payload bytes of selected packets by
//	   verdict, and of TCP segments counted and never shed: count:
//	   bytes, issue 41); every other map is layout 4's (tl_settings's
//	   flags gained TL_COUNT_BYTES, which layout 4 never sets)
//	6  source_sketch is gone: the sketch is the program's own, tl_sketch
//	   in .bss, never pinned (issue 42: a cell addressed directly, not
//	   by a helper call); every other map is layout 5's
const Layout = 6

// carriedSince holds, for each counter map a migration carries, the oldest
// layout whose keys and values mean what they mean now. A counter map of
// an older layout, or one whose spec differs, starts from zero.
var carriedSince = map[string]int{
	LimiterMapStats:          0,
	LimiterMapMiscStats:      0,
	LimiterMapMalformedStats: 0,
	LimiterMapSeverityStats:  0,
	LimiterMapSourceStats:    0,
	LimiterMapBytesStats:     5,
}

// policyMaps hold the policy, which Apply writes anew.
var policyMaps = map[string]bool{
	LimiterMapActiveSlot: true, LimiterMapSettings: true, LimiterMapTierTable: true,
	LimiterMapPorts: true, LimiterMapSelectDests: true, LimiterMapExemptSources: true,
}

// settingsPrefix holds, for older layouts whose tl_settings is a prefix of
// this layout's (same fields at the same offsets, what follows is new),
// the size of their value: `status` reads their policy through it.
// TestSettingsPrefix checks it against the testdata objects' BTF.
var settingsPrefix = map[int]uint32{0: 488, 1: 576, 2: 576, 3: 576, 4: 576, 5: 576}

// windowPrefix is the part of tl_window every layout so far shares:
// start_ns, count, last_count, opened, start_jiffies (u64 each, in that
// order). overflowPrefix is tl_overflow's: window[2], packets[2].
const (
	windowPrefix   = 5 * 8
	overflowPrefix = 4 * 8
)

// Carried says what a migration from an older layout kept and what it
// started afresh, besides the policy, which is written anew.
type Carried struct {
	Carried []string
	Reset   []string
}

// Migration carries the state pinned in a directory by an older layout
// into a Limiter loaded without pins: Carry before the program replaces
// the old one on the links, Finish after.
type Migration struct {
	from int
	old  map[string]*ebpf.Map
	// base is what Carry copied of each counter map: key, then CPU.
	base map[string][][]LimiterTlStat
	Carried
}

// CheckLayout reports whether the maps pinned in dir are this layout's
// (CheckPinned) when from is Layout; an older layout always needs a
// migration.
func CheckLayout(dir string, from int) error {
	if from != Layout {
		return fmt.Errorf("layout %d, this version's is %d", from, Layout)
	}
	return CheckPinned(dir)
}

// Migrate opens the maps pinned in dir by layout from and carries into l,
// which was loaded without PinPath and has its policy applied, what keeps
// its meaning: the counters of carriedSince, and the open window (its
// start, count, previous count and number). Everything else starts afresh
// (Reset). l's program must not run yet; call Finish once the old program
// no longer runs, then PinAt.
func (l *Limiter) Migrate(dir string, from int) (*Migration, error) {
	spec, err := LoadLimiter()
	if err != nil {
		return nil, fmt.Errorf("load limiter spec: %w", err)
	}
	if err := sizeMaps(spec); err != nil { // as Load made l's
		return nil, err
	}
	mg := &Migration{from: from, old: map[string]*ebpf.Map{}, base: map[string][][]LimiterTlStat{}}
	for _, f := range l.namedMaps() {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, f.name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err == nil {
			mg.old[f.name] = m
		}
	}
	for _, f := range l.namedMaps() {
		old := mg.old[f.name]
		switch {
		case policyMaps[f.name]:
			// Apply wrote the policy into l's own
		case f.name == LimiterMapWindow:
			err = mg.carryWindow(l)
		case f.name == LimiterMapOverflow && old != nil && mg.old[LimiterMapWindow] != nil:
			// its packets go into the window's count (carryWindow)
		case old == nil:
			mg.Reset = append(mg.Reset, f.name+" (new)")
		case !counterKept(spec.Maps[f.name], old, from):
			mg.Reset = append(mg.Reset, f.name)
		default:
			err = mg.carryCounters(f.name, old, *f.dst)
		}
		if err != nil {
			mg.Close()
			return nil, err
		}
	}
	return mg, nil
}

// counterKept reports whether the pinned counter map old, of layout from,
// means what spec's map means now.
func counterKept(spec *ebpf.MapSpec, old *ebpf.Map, from int) bool {
	since, ok := carriedSince[spec.Name]
	return ok && from >= since && spec.Compatible(old) == nil
}

func (mg *Migration) carryCounters(name string, old, dst *ebpf.Map) error {
	keys := old.MaxEntries()
	base := make([][]LimiterTlStat, keys)
	for k := range keys {
		if err := old.Lookup(k, &base[k]); err != nil {
			return fmt.Errorf("read pinned %s[%d]: %w", name, k, err)
		}
		if err := dst.Put(k, base[k]); err != nil {
			return fmt.Errorf("carry %s[%d]: %w", name, k, err)
		}
	}
	mg.base[name] = base
	mg.Carried.Carried = append(mg.Carried.Carried, name)
	return nil
}

// carryWindow puts the pinned window's shared prefix into l's window, its
// count with what the CPUs counted in the old overflow map, all on the
// shared count. The fields the old layout lacks start as a window opens
// them: the start tick from start_jiffies or start_ns in the domain the
// applied settings use, no gap, the previous window's count expected in.
func (mg *Migration) carryWindow(l *Limiter) error {
	old := mg.old[LimiterMapWindow]
	if old == nil || old.ValueSize() < windowPrefix || old.KeySize() != 4 {
		mg.Reset = append(mg.Reset, LimiterMapWindow)
		return nil
	}
	w, err := readOldWindow(old, mg.old[LimiterMapOverflow])
	if err != nil {
		return err
	}
	var set LimiterTlSettings
	if slot, err := l.activeSlot(); err == nil {
		_ = l.objs.Settings.Lookup(slot, &set)
	}
	v := LimiterTlWindow{ExpectIn: w.LastCount}
	w.put(&v)
	v.StartTick = tiers.StartTick(w.StartNs, w.StartJiffies, set.WindowJiffies != 0)
	if err := l.objs.Window.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("carry window: %w", err)
	}
	mg.Carried.Carried = append(mg.Carried.Carried, fmt.Sprintf("window (n=%d, %d opened)", w.Count, w.Opened))
	return nil
}

// readOldWindow decodes the shared prefix of a pinned tl_window, adding to
// its count the current window's packets of the pinned overflow map (nil
// or too small: none).
func readOldWindow(win, ovf *ebpf.Map) (Window, error) {
	raw := make([]byte, win.ValueSize())
	if err := win.Lookup(uint32(0), &raw); err != nil {
		return Window{}, fmt.Errorf("read pinned window: %w", err)
	}
	u := func(i int) uint64 { return binary.NativeEndian.Uint64(raw[8*i:]) }
	w := Window{StartNs: u(0), Count: u(1), LastCount: u(2), Opened: u(3), StartJiffies: u(4)}
	if ovf == nil || ovf.ValueSize() < overflowPrefix || ovf.KeySize() != 4 {
		return w, nil
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return Window{}, fmt.Errorf("count possible CPUs: %w", err)
	}
	row := make([]byte, ovf.ValueSize())
	for cpu := range min(uint32(cpus), ovf.MaxEntries()) {
		if err := ovf.Lookup(cpu, &row); err != nil {
			return Window{}, fmt.Errorf("read pinned overflow of cpu %d: %w", cpu, err)
		}
		o := func(i int) uint64 { return binary.NativeEndian.Uint64(row[8*i:]) }
		for i := range 2 {
			switch o(i) {
			case w.Opened:
				w.Count += o(2 + i)
			case w.Opened - 1:
				if w.Opened > 0 {
					w.LastCount += o(2 + i)
				}
			}
		}
	}
	return w, nil
}

// Finish adds to l's counters what the old program counted after Carry,
// once it no longer runs (its links run l's program). The add races with
// l's program on the same CPU's counter: an increment between the read
// and the write of one key is lost; the window is one syscall, and only
// keys that counted after Carry are written.
func (mg *Migration) Finish(l *Limiter) error {
	for _, f := range l.namedMaps() {
		base, ok := mg.base[f.name]
		if !ok {
			continue
		}
		old := mg.old[f.name]
		var now, cur []LimiterTlStat
		for k := range uint32(len(base)) {
			if err := old.Lookup(k, &now); err != nil {
				return fmt.Errorf("read pinned %s[%d]: %w", f.name, k, err)
			}
			if slices.Equal(now, base[k]) {
				continue
			}
			if err := (*f.dst).Lookup(k, &cur); err != nil {
				return fmt.Errorf("read %s[%d]: %w", f.name, k, err)
			}
			for cpu := range min(len(cur), len(now), len(base[k])) {
				cur[cpu].Packets += now[cpu].Packets - base[k][cpu].Packets
				cur[cpu].Bytes += now[cpu].Bytes - base[k][cpu].Bytes
			}
			if err := (*f.dst).Put(k, cur); err != nil {
				return fmt.Errorf("carry %s[%d]: %w", f.name, k, err)
			}
		}
	}
	return nil
}

// Close releases the old maps (their pins stay until PinAt replaces them).
func (mg *Migration) Close() {
	for _, m := range mg.old {
		m.Close()
	}
}

// PinAt pins l's maps, loaded without PinPath, under dir in place of what
// is pinned there: each is pinned under tmp first and renamed over its
// name in dir, so that every name always holds a map. Pins in dir that
// are no map of this layout are removed, and so is tmp.
func (l *Limiter) PinAt(dir, tmp string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make %s: %w", dir, err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("remove %s: %w", tmp, err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("make %s: %w", tmp, err)
	}
	keep := map[string]bool{}
	for _, f := range l.namedMaps() {
		m := *f.dst
		if err := m.Unpin(); err != nil {
			return fmt.Errorf("unpin map %s: %w", f.name, err)
		}
		if err := m.Pin(filepath.Join(tmp, f.name)); err != nil {
			return fmt.Errorf("pin map %s: %w", f.name, err)
		}
		if err := os.Rename(filepath.Join(tmp, f.name), filepath.Join(dir, f.name)); err != nil {
			return fmt.Errorf("pin map %s: %w", f.name, err)
		}
		// The map's own record of its pin is tmp's: forget it, so that
		// Repin and Unpin start from the name in dir.
		if err := m.Unpin(); err != nil {
			return fmt.Errorf("unpin map %s: %w", f.name, err)
		}
		keep[f.name] = true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		if !keep[e.Name()] {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove old map %s: %w", e.Name(), err)
			}
		}
	}
	return os.RemoveAll(tmp)
}
