package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"github.com/cilium/ebpf"
)

// CheckPinned reports whether the maps pinned in dir, if any, are the ones
// Load with Options.PinPath = dir would reuse: same type, key and value
// sizes, size and flags. It writes nothing. Returns an error naming the
// first pinned map that differs; nil when none is pinned.
func CheckPinned(dir string) error {
	spec, err := LoadLimiter()
	if err != nil {
		return fmt.Errorf("load limiter spec: %w", err)
	}
	if err := sizeMaps(spec); err != nil {
		return err
	}
	for name, ms := range spec.Maps {
		if !pinnedName(name) {
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

// OpenPinned opens the maps pinned in dir by a Limiter of layout from
// (Layout, or an older one), without loading the program: enough for
// Stats, Window and Active, as `tierlimit status` needs with no agent
// running. A map the older layout lacks or reads differently is replaced
// by an empty one of this layout holding what carries over (the window's
// shared prefix; the settings when they are a prefix of this layout's), so
// that every read works; unread names those whose content could not be
// read. Program returns nil on the result; Apply must not be called.
func OpenPinned(dir string, from int) (_ *Limiter, unread []string, err error) {
	spec, err := LoadLimiter()
	if err != nil {
		return nil, nil, fmt.Errorf("load limiter spec: %w", err)
	}
	// The specs as Load makes them (source_top sized by the CPU count), so
	// that this layout's own maps compare equal.
	if err := sizeMaps(spec); err != nil {
		return nil, nil, err
	}
	l := &Limiter{}
	old := map[string]*ebpf.Map{}
	defer func() {
		for name, m := range old {
			if m != l.mapNamed(name) {
				m.Close()
			}
		}
		if err != nil {
			l.objs.Close()
		}
	}()
	for _, f := range l.namedMaps() {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, f.name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err == nil {
			old[f.name] = m
		} else if from == Layout || !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("open pinned map %s: %w", f.name, err)
		}
	}
	for _, f := range l.namedMaps() {
		ms, m := spec.Maps[f.name], old[f.name]
		kept := m != nil && ms.Compatible(m) == nil
		if kept && (from == Layout || counterKept(ms, m, from) || sameMeaning[f.name]) {
			*f.dst = m
			continue
		}
		if *f.dst, err = emptyMap(ms); err != nil {
			return nil, nil, err
		}
		switch {
		case f.name == LimiterMapWindow && m != nil && m.ValueSize() >= windowPrefix:
			err = viewWindow(*f.dst, m, old[LimiterMapOverflow])
		case f.name == LimiterMapSettings && m != nil && settingsPrefix[from] == m.ValueSize():
			err = viewSettings(*f.dst, m)
		case f.name == LimiterMapSmoothCpu && m == nil:
		case f.name == LimiterMapOverflow && old[LimiterMapWindow] != nil:
			// its packets are in the window's count (viewWindow)
		case statusReads[f.name]:
			unread = append(unread, f.name)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	return l, unread, nil
}

// sameMeaning names the maps whose content means the same in every layout
// so far, besides the counters: enough for status to read them as they are
// when their spec matches.
var sameMeaning = map[string]bool{
	LimiterMapActiveSlot: true, LimiterMapTierTable: true, LimiterMapPorts: true,
	LimiterMapExemptSources: true, LimiterMapSelectDests: true, LimiterMapSourceTop: true,
}

// statusReads names the maps Stats, Window, Active and TopSources read:
// the others, replaced by empty ones, are not missed.
var statusReads = map[string]bool{
	LimiterMapStats: true, LimiterMapMiscStats: true, LimiterMapMalformedStats: true,
	LimiterMapSeverityStats: true, LimiterMapSourceStats: true, LimiterMapWindow: true,
	LimiterMapSettings: true, LimiterMapActiveSlot: true, LimiterMapSourceTop: true,
}

func (l *Limiter) mapNamed(name string) *ebpf.Map {
	for _, f := range l.namedMaps() {
		if f.name == name {
			return *f.dst
		}
	}
	return nil
}

// emptyMap creates an unpinned map of spec.
func emptyMap(spec *ebpf.MapSpec) (*ebpf.Map, error) {
	s := spec.Copy()
	s.Pinning = ebpf.PinNone
	s.Contents = nil
	m, err := ebpf.NewMap(s)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", spec.Name, err)
	}
	return m, nil
}

func viewWindow(dst, win, ovf *ebpf.Map) error {
	w, err := readOldWindow(win, ovf)
	if err != nil {
		return err
	}
	var v LimiterTlWindow
	w.put(&v)
	return dst.Put(uint32(0), &v)
}

// viewSettings copies the older layout's settings, a prefix of this
// layout's, into dst; the fields it lacks read as zero.
func viewSettings(dst, old *ebpf.Map) error {
	raw := make([]byte, old.ValueSize())
	full := make([]byte, dst.ValueSize())
	for slot := range min(old.MaxEntries(), dst.MaxEntries()) {
		if err := old.Lookup(slot, &raw); err != nil {
			return fmt.Errorf("read pinned settings: %w", err)
		}
		clear(full)
		copy(full, raw)
		if err := dst.Put(slot, full); err != nil {
			return fmt.Errorf("copy settings: %w", err)
		}
	}
	return nil
}

type namedMap struct {
	dst  **ebpf.Map
	name string
}

// unpinned names the maps that hold nothing past a packet or a load, and
// so are never pinned: the judgement's arguments across its tail call, and
// the program array of that tail call, which must hold this load's
// tl_judge_tail (a pinned one reused would hold an older load's).
var unpinned = map[string]bool{LimiterMapTlJudgeArgs: true, LimiterMapTlJump: true}

// pinnedName reports whether the map of an object named name is pinned
// under the pin directory: not a section's (.rodata, .bss), not unpinned.
func pinnedName(name string) bool {
	return name != "" && name[0] != '.' && !unpinned[name]
}

// namedMaps lists every pinned map of the program with the name it is pinned
// under, read from the bpf2go struct's ebpf tags, so that a map added to
// maps.h is pinned, re-pinned and opened without a list to keep.
func (l *Limiter) namedMaps() []namedMap {
	v := reflect.ValueOf(&l.objs.LimiterMaps).Elem()
	var out []namedMap
	for i := range v.NumField() {
		name := v.Type().Field(i).Tag.Get("ebpf")
		if m, ok := v.Field(i).Addr().Interface().(**ebpf.Map); ok && pinnedName(name) {
			out = append(out, namedMap{m, name})
		}
	}
	return out
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
		path := filepath.Join(dir, f.name)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpin map %s: %w", f.name, err)
		}
		if err := m.Pin(path); err != nil {
			return fmt.Errorf("pin map %s: %w", f.name, err)
		}
	}
	return nil
}

// PinnedMaps reports whether every map is pinned under dir as this
// limiter's map (same map id).
func (l *Limiter) PinnedMaps(dir string) bool {
	for _, f := range l.namedMaps() {
		if !pinnedAs(*f.dst, filepath.Join(dir, f.name)) {
			return false
		}
	}
	return true
}

// JumpPinned reports whether the program array pinned at path is this
// limiter's JumpTable (same map id); true for an object without one.
func (l *Limiter) JumpPinned(path string) bool {
	return l.objs.TlJump == nil || pinnedAs(l.objs.TlJump, path)
}

// pinnedAs reports whether the map pinned at path is m (same map id).
func pinnedAs(m *ebpf.Map, path string) bool {
	p, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return false
	}
	a, _ := p.Info()
	p.Close()
	b, _ := m.Info()
	if a == nil || b == nil {
		return false
	}
	ida, _ := a.ID()
	idb, _ := b.ID()
	return ida == idb
}
