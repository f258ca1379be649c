package bpf_test

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
)

// hotBefore is the program issue 42 started from (main at e0aae32), the
// "before" of BenchmarkHotPath.
const hotBefore = "testdata/wave6-before/limiter_bpfel.o"

// BenchmarkHotPath measures each selected path of TestHotPathCalls
// (hotPaths) beside a bare XDP_PASS, a bare XDP_DROP, the floor of the
// required work (floorProgram) and, where it loads, the program issue 42
// started from (hotBefore), chunk by chunk in the same run (hotChunk
// packets, best chunk of each with each first in turn, bestRotatedChunk).
// It reports ns/pkt for each and the ratios: x-pass (over the bare
// XDP_PASS), x-floor, x-before (today's over the earlier program's); and
// the same by the kernel's figure, k-ns/pkt and k-x-*.
func BenchmarkHotPath(b *testing.B) {
	Require(b)
	for _, path := range hotPaths() {
		b.Run(path.name, func(b *testing.B) {
			frame := path.frame(b)
			h := newHarness(b, path.p)
			progs := []*ebpf.Program{h.l.Program(), BareProgram(b, xdpPass), BareProgram(b, xdpDrop), floorProgram(b)}
			hs := []*harness{h}
			if l, err := bpf.LoadObject(bpf.Options{TickNs: kernelTick(b)}, hotBefore); err != nil {
				b.Logf("no before column: %s does not load with today's loader: %v", hotBefore, err)
			} else {
				old := newHarnessWith(b, path.p, l)
				hs = append(hs, old)
				progs = append(progs, old.l.Program())
			}
			for _, h := range hs {
				if path.setup != nil {
					path.setup(b, h.l)
				}
				h.expire()
				// The window opens, saturates on the drop paths, and an
				// onset's clock ticks pass (pathCalls' steady state).
				if _, err := runExact(h.l.Program(), frame, 1<<20); err != nil {
					b.Fatal(err)
				}
			}
			best, kern := bestRotatedChunk(b, frame, hotChunk, progs...)
			b.ReportMetric(best[0], "ns/pkt")
			b.ReportMetric(best[1], "pass-ns/pkt")
			b.ReportMetric(best[2], "drop-ns/pkt")
			b.ReportMetric(best[3], "floor-ns/pkt")
			b.ReportMetric(best[0]/best[1], "x-pass")
			b.ReportMetric(best[0]/best[3], "x-floor")
			if len(best) > 4 {
				b.ReportMetric(best[4], "before-ns/pkt")
				b.ReportMetric(best[0]/best[4], "x-before")
				b.ReportMetric(kern[0]/kern[4], "k-x-before")
			}
			// The kernel's figures (bestRotatedChunk): whole ns, but
			// not slowed by the thread being scheduled out.
			b.ReportMetric(kern[0], "k-ns/pkt")
			b.ReportMetric(kern[0]/kern[1], "k-x-pass")
			b.ReportMetric(kern[0]/kern[3], "k-x-floor")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// floorProgram loads the floor of what a selected packet requires of any
// program that judges it as docs/design.md §2 does, each part in its
// cheapest form and nothing else, on UDP4's frames: the parse to the UDP
// destination port (Ethernet type, IPv4 without options, protocol, port
// 514), one inlined array lookup (the window), one atomic add (its count)
// and one bpf_get_prandom_u32 (the draw). It returns XDP_PASS when the
// frame is selected (the draw decides nothing: the floor pays for it),
// XDP_ABORTED otherwise, so that a caller can tell it made every step.
func floorProgram(tb testing.TB) *ebpf.Program {
	tb.Helper()
	cells, err := ebpf.NewMap(&ebpf.MapSpec{Name: "floor_window", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cells.Close() })
	const l3 = 14
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, l3+20+8),
		asm.JGT.Reg(asm.R4, asm.R3, "out"),
		asm.LoadMem(asm.R4, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R4, 0x0008, "out"), // ETH_P_IP, network order
		asm.LoadMem(asm.R4, asm.R2, l3, asm.Byte),
		asm.JNE.Imm(asm.R4, 0x45, "out"), // IPv4, IHL 5
		asm.LoadMem(asm.R4, asm.R2, l3+9, asm.Byte),
		asm.JNE.Imm(asm.R4, 17, "out"), // UDP
		asm.LoadMem(asm.R4, asm.R2, l3+20+2, asm.Half),
		asm.JNE.Imm(asm.R4, 0x0202, "out"), // port 514, network order
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
	}
	insns = append(insns, Lookup(cells, -4, "out")...)
	insns = append(insns,
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.FnGetPrandomU32.Call(),
		asm.Mov.Imm(asm.R0, xdpPass),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "floor", Type: ebpf.XDP, Instructions: insns, License: "GPL"})
	if err != nil {
		tb.Fatalf("load the floor program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	if act, err := runExact(prog, UDP4(tb, 514), 1); err != nil || act != xdpPass {
		tb.Fatalf("floor on a selected frame: %v, %v: want XDP_PASS, every step made", act, err)
	}
	return prog
}
