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

// BenchmarkHostChecks measures what docs/design.md §2's "for this host" rule
// adds to the selected-pass path (BenchmarkProgram's: tier 0 under max
// 10^8): the checks of frames Linux discards (bpf/host.h: another host's
// MAC, martians) and the rules' dests: local, the default. Chunk by chunk
// in one run (best chunk each), on UDP4 and UDP6 frames to the described
// MAC and a local address, which pass every check:
//   - ns/pkt: today's program with the frames' interface (the test
//     namespace's lo, where BPF_PROG_TEST_RUN runs it) described and the
//     rule's dests: local resolved (localDests);
//   - unchecked-ns/pkt: today's program with no interface described and
//     the rule's dests any: none of the rule's checks;
//   - on UDP4, bare-ns/pkt and floor-ns/pkt: a bare XDP_DROP, and
//     testenv.HostFloorProgram, the same checks at their cheapest with
//     nothing else around them;
//   - before-ns/pkt, when TIERLIMIT_BEFORE_OBJ names the object of an
//     earlier build with the same maps (git show REV:bpf/limiter_bpfel.o):
//     that program with the unchecked policy, on maps of its own as each
//     of the others.
//
// It reports x-unchecked and x-before, today's checked path over each,
// and on UDP4 x-floor-added, 1 + (floor − bare) / unchecked: the least
// that any program making these checks adds to today's unchecked path.

func BenchmarkHostChecks(b *testing.B) {
	Require(b)
	p := ordinalDefault()
	p.Window, p.Max = time.Hour, 100_000_000
	p.Record = tiers.Record{}
	for _, f := range []struct {
		name  string
		frame []byte
	}{{"selected-pass", UDP4(b, 514)}, {"selected-pass-ipv6", UDP6(b, 514)}} {
		b.Run(f.name, func(b *testing.B) {
			checked := newHarness(b, localDests(p))
			if _, err := checked.l.SetIfaces([]bpf.Iface{{Index: 1, MAC: DstMAC, CheckMAC: true, Martians: true, LocalnetMartian: true}}); err != nil {
				b.Fatal(err)
			}
			unchecked := newHarness(b, p)
			progs := []*ebpf.Program{checked.l.Program(), unchecked.l.Program()}
			hs := []*harness{checked, unchecked}
			floor := -1
			if f.name == "selected-pass" {
				fl := HostFloorProgram(b, 1, DstMAC, Dst4, false)
				if act, err := runExact(fl, f.frame, 1); err != nil || act != xdpPass {
					b.Fatalf("host floor: %v, %v: want XDP_PASS, every check made", act, err)
				}
				floor = len(progs)
				progs = append(progs, BareProgram(b, xdpDrop), fl)
			}
			before := -1
			if obj := os.Getenv("TIERLIMIT_BEFORE_OBJ"); obj != "" {
				// On maps of its own, as each of the others.
				bh := newHarness(b, p)
				before = len(progs)
				progs = append(progs, beforeProgram(b, obj, bh.l))
				hs = append(hs, bh)
			}
			for _, h := range hs {
				h.expire()
			}
			for _, prog := range progs {
				if _, err := runExact(prog, f.frame, 200); err != nil {
					b.Fatal(err)
				}
			}
			s0 := checked.stats()
			// Each program in each place of the round, in turn: the first
			// of a round runs on a colder cache.
			best := bestRotated(b, f.frame, progs...)
			if s1 := checked.stats(); s1.SelectedPackets() == s0.SelectedPackets() {
				b.Fatal("the checked program counted none of the frames: the bench measures the wrong path")
			}
			b.ReportMetric(best[0], "ns/pkt")
			b.ReportMetric(best[1], "unchecked-ns/pkt")
			b.ReportMetric(best[0]/best[1], "x-unchecked")
			if floor >= 0 {
				b.ReportMetric(best[floor], "bare-ns/pkt")
				b.ReportMetric(best[floor+1], "floor-ns/pkt")
				b.ReportMetric(1+(best[floor+1]-best[floor])/best[1], "x-floor-added")
			}
			if before >= 0 {
				b.ReportMetric(best[before], "before-ns/pkt")
				b.ReportMetric(best[0]/best[before], "x-before")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// beforeProgram loads the program of the object at path on l's maps
// (those of the same spec: every one the selected path reads).
func beforeProgram(b *testing.B, path string, l *bpf.Limiter) *ebpf.Program {
	b.Helper()
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		b.Fatal(err)
	}
	repl := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		// source_top is sized by the CPU count at load: the selected
		// path never reads it, so the earlier program keeps its own.
		if m := l.MapNamed(name); m != nil && ms.Compatible(m) == nil {
			repl[name] = m
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		b.Fatalf("load %s on today's maps: %v", path, err)
	}
	b.Cleanup(coll.Close)
	return coll.Programs["tierlimit"]
}
