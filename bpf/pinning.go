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

// namedMaps lists every map of the program with the name it is pinned
// under, read from the bpf2go struct's ebpf tags, so that a map added to
// limiter.c is pinned, re-pinned and opened without a list to keep.
func (l *Limiter) namedMaps() []namedMap {
	v := reflect.ValueOf(&l.objs.LimiterMaps).Elem()
	var out []namedMap
	for i := range v.NumField() {
		name := v.Type().Field(i).Tag.Get("ebpf")
		if m, ok := v.Field(i).Addr().Interface().(**ebpf.Map); ok && name != "" {
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
