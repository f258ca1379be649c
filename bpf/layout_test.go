package bpf

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// describeLayout writes every pinned map's spec and the layout of its key
// and value types, member by member: what a program of another layout
// would read differently.
func describeLayout(t *testing.T, spec *ebpf.CollectionSpec) string {
	t.Helper()
	var b strings.Builder
	names := make([]string, 0, len(spec.Maps))
	for name := range spec.Maps {
		if pinnedName(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		m := spec.Maps[name]
		fmt.Fprintf(&b, "%s %v key %d value %d entries %d flags %#x\n  key ", name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags)
		describeType(&b, m.Key, 0)
		b.WriteString("\n  value ")
		describeType(&b, m.Value, 0)
		b.WriteString("\n")
	}
	// The sketch's place in the program's globals (maps.h tl_sketch, since
	// layout 6): the agent of a restart adopts it from the old program's
	// (Limiter.AdoptSketch), where this build puts it.
	if v, ok := spec.Variables[LimiterVarTlSketch]; ok {
		fmt.Fprintf(&b, "%s %s offset %d size %d\n", v.Name, v.SectionName, v.Offset, v.Size())
	}
	return b.String()
}

func describeType(b *strings.Builder, typ btf.Type, depth int) {
	if depth > 8 {
		b.WriteString("...")
		return
	}
	switch v := btf.UnderlyingType(typ).(type) {
	case *btf.Struct:
		fmt.Fprintf(b, "struct %s{", v.Name)
		for _, m := range v.Members {
			fmt.Fprintf(b, "%s@%d:", m.Name, m.Offset.Bytes())
			describeType(b, m.Type, depth+1)
			b.WriteString(";")
		}
		b.WriteString("}")
	case *btf.Union:
		fmt.Fprintf(b, "union %s{", v.Name)
		for _, m := range v.Members {
			fmt.Fprintf(b, "%s:", m.Name)
			describeType(b, m.Type, depth+1)
			b.WriteString(";")
		}
		b.WriteString("}")
	case *btf.Array:
		fmt.Fprintf(b, "[%d]", v.Nelems)
		describeType(b, v.Type, depth+1)
	case *btf.Int:
		fmt.Fprintf(b, "int%d", v.Size*8)
	case *btf.Enum:
		fmt.Fprintf(b, "enum%d", v.Size*8)
	case nil:
		b.WriteString("none")
	default:
		fmt.Fprintf(b, "%T", v)
	}
}

// TestLayoutGolden fails when a pinned map's spec or the layout of what it
// holds changes while bpf.Layout stays: bump Layout (docs/design.md §11), say
// what the new layout carries (carriedSince, settingsPrefix), and record
// the new digest in testdata/layout.golden. A field renamed at the same
// size (a pad that gains a meaning) changes the digest too.
func TestLayoutGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/layout.golden")
	if err != nil {
		t.Fatal(err)
	}
	golden := map[int]string{} // layout -> digest
	for line := range strings.Lines(string(raw)) {
		n, digest, _ := strings.Cut(strings.TrimSpace(line), " ")
		v, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("testdata/layout.golden: %q", line)
		}
		golden[v] = digest
	}
	check := func(layout int, spec *ebpf.CollectionSpec) {
		desc := describeLayout(t, spec)
		sum := sha256.Sum256([]byte(desc))
		if got := hex.EncodeToString(sum[:]); got != golden[layout] {
			t.Errorf("layout %d is %s, testdata/layout.golden says %q: the pinned maps changed. "+
				"Bump bpf.Layout, say what the new layout carries (carriedSince, settingsPrefix), "+
				"and add the line %q there. The layout now:\n%s", layout, got, golden[layout], fmt.Sprintf("%d %s", layout+1, got), desc)
		}
	}
	spec, err := LoadLimiter()
	if err != nil {
		t.Fatal(err)
	}
	check(Layout, spec)
	for v := range Layout {
		// Older layouts whose objects testdata keeps: they never change.
		old, err := ebpf.LoadCollectionSpec(fmt.Sprintf("testdata/layout-%d/limiter_bpfel.o", v))
		if err == nil {
			check(v, old)
		}
	}
}

// TestSettingsPrefix checks settingsPrefix against the testdata objects:
// each older layout's tl_settings has this one's members at the same
// offsets, but for pads that became fields, and is the size recorded.
func TestSettingsPrefix(t *testing.T) {
	cur, err := LoadLimiter()
	if err != nil {
		t.Fatal(err)
	}
	now := members(t, cur)
	for from, size := range settingsPrefix {
		old, err := ebpf.LoadCollectionSpec(fmt.Sprintf("testdata/layout-%d/limiter_bpfel.o", from))
		if err != nil {
			t.Fatal(err)
		}
		if got := old.Maps[LimiterMapSettings].ValueSize; got != size {
			t.Errorf("layout %d: tl_settings is %d bytes, settingsPrefix says %d", from, got, size)
		}
		for off, name := range members(t, old) {
			if n, ok := now[off]; !ok || n != name && !strings.HasPrefix(name, "_pad") {
				t.Errorf("layout %d: tl_settings member %s at byte %d is %q now", from, name, off, n)
			}
		}
	}
}

func members(t *testing.T, spec *ebpf.CollectionSpec) map[uint32]string {
	t.Helper()
	s, ok := btf.UnderlyingType(spec.Maps[LimiterMapSettings].Value).(*btf.Struct)
	if !ok {
		t.Fatal("settings' value is no struct")
	}
	out := map[uint32]string{}
	for _, m := range s.Members {
		out[m.Offset.Bytes()] = m.Name
	}
	return out
}
