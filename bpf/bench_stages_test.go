//go:build tlstages

package bpf_test

import (
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// stage names a TL_STAGE stop (bpf/verdict.h) for BenchmarkStages' metrics;
// "full" (0) is the whole program.
type stage struct {
	name string
	at   bpf.LimiterTlStage
}

var (
	stEntry  = stage{"entry", bpf.LimiterTlStageTL_STAGE_ENTRY}
	stParsed = stage{"parsed", bpf.LimiterTlStageTL_STAGE_PARSED}
	stJudge  = stage{"judge", bpf.LimiterTlStageTL_STAGE_JUDGE}
	stPolicy = stage{"policy", bpf.LimiterTlStageTL_STAGE_POLICY}
	stGroup  = stage{"group", bpf.LimiterTlStageTL_STAGE_GROUP}
	stSketch = stage{"sketch", bpf.LimiterTlStageTL_STAGE_SKETCH}
	stWindow = stage{"window", bpf.LimiterTlStageTL_STAGE_WINDOW}
	stFull   = stage{"full", 0}
)

// newHarnessStage is newHarnessOpts for a program that stops every packet
// at stage (bpf.LoadStage); 0 is the whole program.
func newHarnessStage(tb testing.TB, p tiers.Policy, opts bpf.Options, stage bpf.LimiterTlStage) *harness {
	tb.Helper()
	Require(tb)
	l, err := bpf.LoadStage(opts, stage)
	if err != nil {
		tb.Fatal(err)
	}
	return newHarnessWith(tb, p, l)
}

// BenchmarkStages splits the cost of the program's main paths by stage
// (TL_STAGE, bpf/verdict.h): for each path the program is loaded once per
// stage it reaches (bpf.LoadStage: every packet returns XDP_DROP there)
// and once whole, and all of them run chunk by chunk beside a bare
// XDP_DROP on the same frame (BenchmarkProgram's method). It reports each
// one's best chunk in ns/pkt as <stage>-ns, and bare-ns; what a stage
// costs is the difference from the stage before it. The stage loads must
// count nothing (they stop before the stats); the benchmark checks it.
func BenchmarkStages(b *testing.B) {
	policy := func(max uint64) tiers.Policy {
		p := ordinalDefault()
		p.Window, p.Max = time.Hour, max
		return p
	}
	policyStages := []stage{stEntry, stParsed, stJudge, stPolicy, stWindow, stFull}
	sourceStages := []stage{stEntry, stParsed, stJudge, stPolicy, stGroup, stSketch, stWindow, stFull}
	inBudget := tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64}
	for _, path := range []struct {
		name   string
		p      tiers.Policy
		stages []stage
	}{
		// BenchmarkProgram's paths of the same names.
		{"selected-drop", policy(100), policyStages},
		{"selected-pass", policy(benchPassMax), policyStages},
		{"sources-pass", withSources(policy(benchPassMax), inBudget), sourceStages},
		// Over budget: the packet never reaches the window.
		{"sources-over", withSources(policy(benchPassMax), tiers.Sources{BudgetPackets: 1, PrefixV4: 32, PrefixV6: 64}),
			[]stage{stEntry, stParsed, stJudge, stPolicy, stGroup, stSketch, stFull}},
	} {
		b.Run(path.name, func(b *testing.B) {
			frame := UDP4(b, 514)
			bare := BareProgram(b, xdpDrop)
			// All loads share one set of maps (pinned), so that the whole
			// program's first packet opens the window for all of them, as
			// in traffic: the tick gate then spares the clock for every
			// stage that reads the window's state.
			pin := PinPath(b)
			if err := os.MkdirAll(pin, 0o700); err != nil {
				b.Fatal(err)
			}
			opts := bpf.Options{TickNs: kernelTick(b), PinPath: pin}
			full := len(path.stages) - 1 // the last is stFull
			hs := make([]*harness, len(path.stages))
			hs[full] = newHarnessStage(b, path.p, opts, 0)
			hs[full].expire()
			hs[full].run(frame)
			for i, st := range path.stages[:full] {
				hs[i] = newHarnessStage(b, path.p, opts, st.at)
			}
			// The maps are shared, and only the whole program counts:
			// every packet it runs, and none of the stage loads'.
			c0 := counted(hs[full])
			progs := make([]*ebpf.Program, 0, len(hs)+1)
			for _, h := range hs {
				progs = append(progs, h.l.Program())
			}
			best := bestChunks(b, frame, append(progs, bare)...)
			if got, want := counted(hs[full])-c0, chunkPackets(b); got != want {
				b.Fatalf("the programs counted %d packets, want the whole program's %d: a stage load counted (it must stop before the stats)", got, want)
			}
			bareNs := best[len(hs)]
			for i, st := range path.stages {
				b.ReportMetric(best[i], st.name+"-ns")
			}
			b.ReportMetric(bareNs, "bare-ns")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// counted is every packet h's maps have counted, selected, over budget or
// not selected.
func counted(h *harness) uint64 {
	s := h.stats()
	return s.SelectedPackets() + overBudget(s) + s.Unselected.Packets
}
