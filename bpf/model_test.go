package bpf_test

import "fmt"

// An exhaustive checker of the program's lock-free protocols at small
// sizes: every CPU is a little state machine whose steps are the C code's
// memory operations (one load, store or atomic each), and explore runs
// every interleaving of the CPUs' steps, checking an invariant after each.
// Plain loads and stores between two atomics may be reordered (arm64
// reorders them; BPF atomics with a fetch are fully ordered): the tests
// give each such group of steps in every order, as separate programs.

// mstate is one state of the machine: shared memory, and per CPU its next
// step (-1 when done) and locals. Comparable, so explore remembers states.
type mstate struct {
	mem [8]int64
	pc  [4]int
	loc [4][6]int64
}

// mstep is one step of CPU t: it reads and writes s and returns the next
// step's index, or -1 when the CPU is done.
type mstep func(s *mstate, t int) int

// explore runs every interleaving of the CPUs' programs from init, calling
// check after each step; it returns how many states it visited and the
// first violation, with the steps that led to it.
func explore(init mstate, progs [][]mstep, check func(*mstate) error) (int, error) {
	seen := map[mstate]bool{}
	var trace []int
	var dfs func(s mstate) error
	dfs = func(s mstate) error {
		if seen[s] {
			return nil
		}
		seen[s] = true
		for t := range progs {
			pc := s.pc[t]
			if pc < 0 || pc >= len(progs[t]) {
				continue
			}
			next := s
			next.pc[t] = progs[t][pc](&next, t)
			trace = append(trace, t)
			if err := check(&next); err != nil {
				return fmt.Errorf("%w (CPUs in step order: %v)", err, trace)
			}
			if err := dfs(next); err != nil {
				return err
			}
			trace = trace[:len(trace)-1]
		}
		return nil
	}
	for t := len(progs); t < len(init.pc); t++ {
		init.pc[t] = -1
	}
	err := dfs(init)
	return len(seen), err
}

// permutations returns every order of steps.
func permutations(steps []mstep) [][]mstep {
	if len(steps) <= 1 {
		return [][]mstep{steps}
	}
	var out [][]mstep
	for i := range steps {
		rest := append(append([]mstep{}, steps[:i]...), steps[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]mstep{steps[i]}, p...))
		}
	}
	return out
}

// seqs chains steps that each go on to the next (and the last to done),
// after the groups of plain steps were put in order.
func seqs(groups ...[]mstep) [][]mstep {
	out := [][]mstep{nil}
	for _, g := range groups {
		var next [][]mstep
		for _, prefix := range out {
			for _, p := range permutations(g) {
				next = append(next, append(append([]mstep{}, prefix...), p...))
			}
		}
		out = next
	}
	for i, prog := range out {
		linked := make([]mstep, len(prog))
		for j, st := range prog {
			linked[j] = func(s *mstate, t int) int {
				if st(s, t) < 0 || j+1 == len(prog) {
					return -1
				}
				return j + 1
			}
		}
		out[i] = linked
	}
	return out
}
