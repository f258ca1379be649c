// Package testenv holds what the tierlimit BPF and integration tests share:
// the root/BPF gate, frames crafted with gopacket, and network namespaces
// that a test creates and always removes. It is imported by tests only.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// RequireEnv is the variable that turns a skip into a failure: .ci/run sets
// it, so that BPF tests can never silently skip in CI.
const RequireEnv = "TIERLIMIT_REQUIRE_BPF"

// Require skips tb unless the process can load BPF programs (root, a kernel
// with BPF), giving the reason. With TIERLIMIT_REQUIRE_BPF=1 it fails
// instead of skipping.
func Require(tb testing.TB) {
	tb.Helper()
	if reason := unavailable(); reason != "" {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("BPF tests required (%s=1) but cannot run: %s", RequireEnv, reason)
		}
		tb.Skipf("skipping BPF test: %s (run as root on Linux >= 5.12; set %s=1 to fail instead)", reason, RequireEnv)
	}
}

func unavailable() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return "remove memlock rlimit: " + err.Error()
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return "kernel lacks XDP support"
		}
		return "load a trivial XDP program: " + err.Error()
	}
	prog.Close()
	return ""
}

// BareProgram loads a program named "bare" that returns action for every
// packet: the baseline of the benchmarks.
func BareProgram(tb testing.TB, action int32) *ebpf.Program {
	tb.Helper()
	return NamedProgram(tb, "bare", action)
}

// NamedProgram loads an XDP program named name that returns action for
// every packet, closed when tb ends: a foreign program for AttachForeign,
// or one that only its name makes look like tierlimit's.
func NamedProgram(tb testing.TB, name string, action int32) *ebpf.Program {
	tb.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         name,
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, action), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		tb.Fatalf("load %s program: %v", name, err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// FloorLine is the value size of AtomicFloorProgram's cells, in bytes: one
// x86 cache line, so that each cell is a line of its own.
const FloorLine = 64

// AtomicFloorProgram loads an XDP program that, for every packet, looks up
// each of the k cells of its array map (keys 0 to k-1, FloorLine bytes
// each, page-aligned: BPF_F_MMAPABLE) and adds 1 to the cell's first
// 64-bit word with an atomic add (BPF_STX | BPF_ATOMIC, BPF_ADD), then
// returns XDP_DROP. It is the floor of a program that must make k atomic
// adds on k distinct cache lines per packet, as DESIGN.md's exact window
// count (one add) and per-source sketch (one per row) require: a bare
// XDP_DROP plus k inlined array lookups and k locked adds, and nothing
// else. It returns the program and its map, whose cells count the packets
// run (the first word of each, little-endian uint64). k must be >= 1.
func AtomicFloorProgram(tb testing.TB, k int) (*ebpf.Program, *ebpf.Map) {
	tb.Helper()
	if k < 1 {
		tb.Fatalf("AtomicFloorProgram: k = %d, want >= 1", k)
	}
	cells, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "floor_cells",
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  FloorLine,
		MaxEntries: uint32(k),
		Flags:      unix.BPF_F_MMAPABLE, // page-aligned values: one line each
	})
	if err != nil {
		tb.Fatalf("create the floor program's map (%d cells): %v", k, err)
	}
	tb.Cleanup(func() { cells.Close() })
	const xdpDrop = 1
	var insns asm.Instructions
	for i := 0; i < k; i++ {
		insns = append(insns,
			asm.StoreImm(asm.RFP, -4, int64(i), asm.Word), // key i
		)
		insns = append(insns, Lookup(cells, -4, "drop")...)
		insns = append(insns,
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		)
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("drop"), asm.Return())
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "floor",
		Type:         ebpf.XDP,
		Instructions: insns,
		License:      "GPL",
	})
	if err != nil {
		tb.Fatalf("load the floor program (%d atomic adds): %v", k, err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog, cells
}

// PinPath returns a fresh pin directory on /sys/fs/bpf for tb (not made
// yet: the agent makes it), and removes it in Cleanup, together with the
// file that each of extra names for it (the agent's lock file, say).
func PinPath(tb testing.TB, extra ...func(pin string) string) string {
	tb.Helper()
	pin := fmt.Sprintf("/sys/fs/bpf/tltest-%d-%d", os.Getpid(), time.Now().UnixNano())
	tb.Cleanup(func() {
		os.RemoveAll(pin)
		for _, f := range extra {
			os.Remove(f(pin))
		}
	})
	return pin
}

// Lookup is bpf_map_lookup_elem(m, the key at RFP+keyOff) in instructions,
// for programs written in asm: R0 holds the value after them, and a miss
// (NULL) jumps to the symbol miss. R1 to R5 are clobbered.
func Lookup(m *ebpf.Map, keyOff int16, miss string) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(keyOff)),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, miss),
	}
}
