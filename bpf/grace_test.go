package bpf_test

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// stalledReader is an XDP program that reads the active slot and that
// slot's window_ns as the limiter does, then stalls for iterations rounds
// of bpf_loop (each reads the clock four times), and reads window_ns again: it returns
// XDP_PASS when the slot was left alone meanwhile, XDP_DROP when it was
// rewritten under it, XDP_ABORTED when a map could not be read.
func stalledReader(t *testing.T, active, settings *ebpf.Map, iterations int32) *ebpf.Program {
	t.Helper()
	voidPtr := &btf.Pointer{Target: &btf.Void{}}
	mainFn := &btf.Func{Name: "stalled", Linkage: btf.GlobalFunc, Type: &btf.FuncProto{
		Return: &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed},
		Params: []btf.FuncParam{{Name: "ctx", Type: voidPtr}},
	}}
	stallFn := &btf.Func{Name: "stall", Linkage: btf.StaticFunc, Type: &btf.FuncProto{
		Return: &btf.Int{Name: "long", Size: 8, Encoding: btf.Signed},
		Params: []btf.FuncParam{{Name: "i", Type: &btf.Int{Name: "u32", Size: 4}}, {Name: "ctx", Type: voidPtr}},
	}}
	insns := asm.Instructions{
		btf.WithFuncMetadata(asm.StoreImm(asm.RFP, -4, 0, asm.Word).WithSymbol("stalled"), mainFn),
	}
	insns = append(insns, testenv.Lookup(active, -4, "out")...)
	insns = append(insns,
		asm.LoadMem(asm.R7, asm.R0, 0, asm.Word),
		asm.StoreMem(asm.RFP, -8, asm.R7, asm.Word),
	)
	insns = append(insns, testenv.Lookup(settings, -8, "out")...)
	insns = append(insns,
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.LoadMem(asm.R8, asm.R0, 0, asm.DWord), // window_ns
		asm.Mov.Imm(asm.R1, iterations),
		asm.Instruction{OpCode: asm.LoadImmOp(asm.DWord), Dst: asm.R2, Src: asm.PseudoFunc, Constant: -1}.WithReference("stall"),
		asm.Mov.Imm(asm.R3, 0),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnLoop.Call(),
		asm.LoadMem(asm.R1, asm.R9, 0, asm.DWord),
		asm.Mov.Imm(asm.R0, xdpPass),
		asm.JEq.Reg(asm.R1, asm.R8, "ret"),
		asm.Mov.Imm(asm.R0, xdpDrop),
		asm.Ja.Label("ret"),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return().WithSymbol("ret"),
		btf.WithFuncMetadata(asm.FnKtimeGetNs.Call().WithSymbol("stall"), stallFn),
		asm.FnKtimeGetNs.Call(),
		asm.FnKtimeGetNs.Call(),
		asm.FnKtimeGetNs.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "stalled", Type: ebpf.XDP, License: "GPL", Instructions: insns})
	if err != nil {
		t.Fatalf("load the stalled reader: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

// TestApplyWaitsForStalledReader is issue 25 §3: a packet that read the
// active slot and then stalls (here 600 ms inside the program, as a
// preempted vCPU would) must never see that slot rewritten. Two reloads
// flip away from its slot and back into it; the second may write the slot
// only once the reader has finished: Apply waits for an RCU grace period,
// not a fixed 20 ms.
func TestApplyWaitsForStalledReader(t *testing.T) {
	p := ordinalDefault()
	p.Window = time.Second
	h := newHarness(t, p)
	active, settings := h.l.SlotMaps()
	frame := make([]byte, 64)

	// How many rounds stall for 600 ms on this machine (bpf_loop's most
	// is 2^23): long beside two reloads on a loaded machine, so that a
	// reload that does not wait for the reader writes its slot under it.
	const probeRounds = 1 << 20
	probe := stalledReader(t, active, settings, probeRounds)
	_, took, err := probe.Benchmark(frame, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	rounds := min(int64(600*time.Millisecond)*probeRounds/int64(max(took, time.Microsecond)), 1<<23)
	reader := stalledReader(t, active, settings, int32(rounds))

	done, started := make(chan uint32, 1), make(chan struct{})
	began := time.Now()
	go func() {
		close(started)
		ret, err := reader.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Error(err)
		}
		done <- ret
	}()
	<-started
	time.Sleep(20 * time.Millisecond) // the reader is in its stall
	p2, p3 := p, p
	p2.Window, p3.Window = 2*time.Second, 3*time.Second
	h.apply(p2) // flips away from the reader's slot
	h.apply(p3) // writes the reader's slot
	applied := time.Since(began)
	ret := <-done
	if ret != xdpPass {
		t.Errorf("the stalled reader returned %d: its slot was rewritten under it", ret)
	}
	t.Logf("reader stalled %d rounds; the reloads returned %v after it began", rounds, applied)
}
