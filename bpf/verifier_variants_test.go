package bpf_test

import (
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	. "github.com/tierlimit/tierlimit/internal/testenv"
)

// verifierBudgetCalls is the budget of the calls-counting build
// (bpf/calls.h, TestHotPathCalls) on Linux 6.18: its counters are a
// lookup and a branch at every call, 340,585 instructions with the
// limiter at 208,913. It loads on the host only (make vagrant-e2e's 6.1
// does not run TestHotPathCalls).
const verifierBudgetCalls = 400_000

// verifierBudgetStages is the budget of the stage-stop build
// (BenchmarkStages, gen.go's limiterStages) on Linux 6.18: each TL_STAGE
// stop is a branch the verifier walks on every path that reaches it
// (273,224 instructions with the limiter at 208,913; 249,733 with main's
// at 217,080 before issue 42's entry check). A benchmark build, loaded on
// the host only.
const verifierBudgetStages = 300_000

// TestVerifierVariants loads every build of the program the tests load
// beside the limiter itself (the stage stops, the perf event array, the
// calls counted; the program issue 42 started from) with the verifier's
// statistics, logs its count and its stack depths, and fails when one
// passes its budget: the limiter's (budgetFor) for the limiter, the perf
// build and the earlier program; their own for the stage stops and the
// calls counted.
func TestVerifierVariants(t *testing.T) {
	Require(t)
	rel := kernelRelease(t)
	for _, v := range []struct {
		object string
		budget int
	}{
		{"limiter_bpfel.o", budgetFor(rel)},
		{"limiterstages_bpfel.o", max(budgetFor(rel), verifierBudgetStages)},
		{"limiterperf_bpfel.o", budgetFor(rel)},
		{callsObject, verifierBudgetCalls},
		{hotBefore, budgetFor(rel)},
	} {
		spec, err := ebpf.LoadCollectionSpec(v.object)
		if err != nil {
			t.Fatal(err)
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats, LogSizeStart: 1 << 20}})
		if err != nil {
			t.Fatalf("%s: load: %v", v.object, err)
		}
		for _, name := range programNames {
			p := coll.Programs[name]
			if p == nil {
				continue // the earlier program has no tail call
			}
			m, s := processedRE.FindStringSubmatch(p.VerifierLog), stackRE.FindStringSubmatch(p.VerifierLog)
			if m == nil || s == nil {
				t.Fatalf("%s %s: no statistics in the verifier log", v.object, name)
			}
			n, _ := strconv.Atoi(m[1])
			t.Logf("%s %s: verifier processed %d instructions on Linux %s (budget %d), stack depth %s", v.object, name, n, rel, v.budget, s[1])
			if n > v.budget {
				t.Errorf("%s %s: the verifier processed %d instructions, over the budget of %d", v.object, name, n, v.budget)
			}
		}
		coll.Close()
	}
}
