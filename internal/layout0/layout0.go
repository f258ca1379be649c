// Package layout0 loads the program this repository built before pinned
// layouts were recorded (commit 90e44a6, layout 0): for the upgrade tests
// (docs/design.md §11) and the benchmarks that run today's program beside it.
package layout0

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// Object is the path of the BPF object of commit 90e44a6, pinned
// layout 0 (bpf/testdata/layout-0/README.md): the program as the wave
// before the smooth shape and budgets that share built it.
func Object() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "bpf", "testdata", "layout-0", "limiter_bpfel.o")
}

// Load loads the layout-0 object, with its maps pinned under pin
// when pin is not empty, and writes policy p into its maps under the
// ordinal shape (the only one it knows): the settings as today's program
// encodes them (layout 0's settings are a prefix of today's,
// bpf.TestSettingsPrefix), the tier table and the selectors. The
// collection is closed when tb ends.
func Load(tb testing.TB, pin string, p tiers.Policy) *ebpf.Collection {
	tb.Helper()
	spec, err := ebpf.LoadCollectionSpec(Object())
	if err != nil {
		tb.Fatal(err)
	}
	return LoadSpec(tb, spec, pin, p)
}

// LoadSpec is Load of spec: the layout-0 object as read, or one built from
// commit 90e44a6's source with changes that keep its maps (a benchmark's
// variant of it), with the spec's variables as the caller set them.
func LoadSpec(tb testing.TB, spec *ebpf.CollectionSpec, pin string, p tiers.Policy) *ebpf.Collection {
	tb.Helper()
	var opts ebpf.CollectionOptions
	if pin != "" {
		for _, m := range spec.Maps {
			if m.Name != "" && m.Name[0] != '.' {
				m.Pinning = ebpf.PinByName
			}
		}
		opts.Maps.PinPath = pin
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if err != nil {
		tb.Fatalf("load the layout-0 object: %v", err)
	}
	tb.Cleanup(coll.Close)
	writeLayout0Policy(tb, coll, p)
	return coll
}

// writeLayout0Policy applies p with today's bpf.Limiter on scratch maps and
// copies what layout 0 reads into coll's maps.
func writeLayout0Policy(tb testing.TB, coll *ebpf.Collection, p tiers.Policy) {
	tb.Helper()
	p.Shape = tiers.ShapeOrdinal
	// With the tick gate where the kernel's tick is known, as the agent
	// of that version configured it.
	tick, _ := bpf.KernelTick()
	tab, err := tiers.Compile(p, tick)
	if err != nil {
		tb.Fatal(err)
	}
	scratch := testenv.PinPath(tb)
	if err := os.Mkdir(scratch, 0o700); err != nil {
		tb.Fatal(err)
	}
	lim, err := bpf.Load(bpf.Options{PinPath: scratch, TickNs: tick})
	if err != nil {
		tb.Fatal(err)
	}
	defer lim.Close()
	if err := lim.Apply(context.Background(), tab); err != nil {
		tb.Fatal(err)
	}
	open := func(name string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(scratch, name), nil)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { m.Close() })
		return m
	}
	var slot uint32
	if err := open("active_slot").Lookup(uint32(0), &slot); err != nil {
		tb.Fatal(err)
	}
	var set bpf.LimiterTlSettings
	if err := open("settings").Lookup(slot, &set); err != nil { // decoded, for TableLen
		tb.Fatal(err)
	}
	settings := open("settings")
	raw := make([]byte, settings.ValueSize())
	if err := settings.Lookup(slot, &raw); err != nil {
		tb.Fatal(err)
	}
	old := coll.Maps["settings"]
	put(tb, old, slot, raw[:old.ValueSize()])
	put(tb, coll.Maps["active_slot"], uint32(0), slot)
	var e bpf.LimiterTlEntry
	table := open("tier_table")
	for i := range set.TableLen {
		k := slot*uint32(bpf.MaxTableEntries) + i
		if err := table.Lookup(k, &e); err != nil {
			tb.Fatal(err)
		}
		put(tb, coll.Maps["tier_table"], k, e)
	}
	for _, name := range []string{"ports", "select_dests", "exempt_sources"} {
		var k, v []byte
		it := open(name).Iterate()
		for it.Next(&k, &v) {
			switch {
			case name == "select_dests" && len(v) == 4:
				// Today one entry per destination holds its rules; up
				// to layout 1, one per rule, the rule in the tag's low
				// byte (bpf/types.h TL_DEST_RULE_BITS).
				for i := range 32 {
					if binary.LittleEndian.Uint32(v)&(1<<i) != 0 {
						r := slices.Clone(k)
						r[4] |= byte(i)
						put(tb, coll.Maps[name], r, []byte{1})
					}
				}
			case strings.Trim(string(v), "\x00") != "" || name != "ports":
				put(tb, coll.Maps[name], k, v)
			}
		}
		if err := it.Err(); err != nil {
			tb.Fatal(err)
		}
	}
}

func put(tb testing.TB, m *ebpf.Map, k, v any) {
	tb.Helper()
	if err := m.Put(k, v); err != nil {
		tb.Fatalf("write %v: %v", m, err)
	}
}
