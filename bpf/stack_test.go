package bpf_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf/asm"
)

// maxStack is the verifier's bound on a chain of BPF-to-BPF frames
// (MAX_BPF_STACK, include/linux/filter.h).
const maxStack = 512

var stackRE = regexp.MustCompile(`stack depth ([0-9+]+)`)

// loopExtra is what the verifier adds to the stack of a function whose
// bpf_loop it inlines (optimize_bpf_loop: three registers, BPF_REG_SIZE *
// 3), after it checked the chain (check_max_stack_depth runs first, on
// 6.1 and 6.18): the depth it prints includes it, the chain it checks
// does not.
const loopExtra = 24

// roundFrame is the stack a frame of depth bytes takes in the verifier's
// chain (check_max_stack_depth): rounded up to 32 bytes, at least 32, on
// Linux 6.1 and every kernel for an interpreted program; to 16 on kernels
// that JIT it since Linux 6.8 (round_up_stack_depth).
func roundFrame(depth int, by16 bool) int {
	if by16 {
		return (depth + 15) &^ 15
	}
	return (max(depth, 1) + 31) &^ 31
}

// TestStackDepth loads the program, reads each function's stack depth
// from the verifier's statistics (in the order of its functions in the
// program; less loopExtra for a function that calls bpf_loop), and finds
// its deepest chain of frames through the calls and the bpf_loop
// callbacks (a function referenced by address), as check_max_stack_depth
// walks it. It logs each
// function's depth and the deepest chain under both roundings (6.1's and
// 6.18's), and fails when the chain passes maxStack under 6.1's rounding,
// the stricter.
func TestStackDepth(t *testing.T) {
	spec, logs := loadWithStats(t)
	for _, name := range programNames {
		t.Run(name, func(t *testing.T) { stackDepth(t, spec.Programs[name].Instructions, logs[name]) })
	}
}

// stackDepth is TestStackDepth of one program: its instructions and its
// verifier log.
func stackDepth(t *testing.T, insns asm.Instructions, log string) {
	m := stackRE.FindStringSubmatch(log)
	if m == nil {
		t.Fatal("no stack depth in the verifier's statistics")
	}
	funcs, callees := callGraph(insns)
	loops := loopCallers(insns)
	parts := strings.Split(m[1], "+")
	if len(parts) != len(funcs) {
		t.Fatalf("the verifier names %d stack depths, the program has %d functions (%v)", len(parts), len(funcs), funcs)
	}
	depth := map[string]int{}
	var rows []string
	for i, f := range funcs {
		printed, _ := strconv.Atoi(parts[i])
		depth[f] = printed
		if loops[f] {
			depth[f] -= loopExtra
		}
		rows = append(rows, fmt.Sprintf("%s %d", f, printed))
	}
	for _, by16 := range []bool{false, true} {
		n, chain := deepestChain(funcs[0], depth, callees, by16)
		rule := map[bool]string{false: "32-byte frames (Linux 6.1)", true: "16-byte frames (Linux >= 6.8, JIT)"}[by16]
		t.Logf("deepest chain with %s: %d of %d bytes: %s", rule, n, maxStack, strings.Join(chain, " > "))
		if !by16 && n > maxStack {
			t.Errorf("the deepest chain takes %d bytes with %s, over %d: %s", n, rule, maxStack, strings.Join(chain, " > "))
		}
	}
	t.Logf("stack depth per function as the verifier prints it (bytes; with %d for an inlined bpf_loop): %s", loopExtra, strings.Join(rows, ", "))
}

// callGraph lists insns' functions in order (the first is the program)
// and, for each, the functions it calls or passes by address (a bpf_loop
// callback).
func callGraph(insns asm.Instructions) ([]string, map[string][]string) {
	var funcs []string
	callees := map[string][]string{}
	cur := ""
	for _, ins := range insns {
		if s := ins.Symbol(); s != "" {
			cur = s
			funcs = append(funcs, s)
		}
		if ins.IsFunctionCall() || ins.IsLoadOfFunctionPointer() {
			callees[cur] = append(callees[cur], ins.Reference())
		}
	}
	return funcs, callees
}

// loopCallers is the functions of insns that call bpf_loop.
func loopCallers(insns asm.Instructions) map[string]bool {
	loops := map[string]bool{}
	cur := ""
	for _, ins := range insns {
		if s := ins.Symbol(); s != "" {
			cur = s
		}
		if ins.IsBuiltinCall() && asm.BuiltinFunc(ins.Constant) == asm.FnLoop {
			loops[cur] = true
		}
	}
	return loops
}

// deepestChain is the most stack a chain of frames from f takes, each
// frame rounded (roundFrame), and the chain.
func deepestChain(f string, depth map[string]int, callees map[string][]string, by16 bool) (int, []string) {
	best, chain := 0, []string(nil)
	for _, c := range callees[f] {
		if n, ch := deepestChain(c, depth, callees, by16); n > best {
			best, chain = n, ch
		}
	}
	return roundFrame(depth[f], by16) + best, append([]string{fmt.Sprintf("%s(%d)", f, depth[f])}, chain...)
}
