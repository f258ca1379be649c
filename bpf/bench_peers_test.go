package bpf_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// peerEntry is one program of BenchmarkPeers: its metric prefix, the
// program, the frame it runs on and the verdict it must return there.
type peerEntry struct {
	name  string
	prog  *ebpf.Program
	frame []byte
	want  uint32
	// h is tierlimit's harness, nil for the others.
	h *harness
}

// BenchmarkPeers is issue 42's table, measured in one run: a bare
// XDP_PASS, the floor (testenv.AtomicFloorProgram with one atomic add:
// the least a program with docs/design.md §2's exact window count does
// per selected packet), tierlimit's selected paths as the agent runs
// them (tick gate on; pass in the smooth shape, the default, and in the
// ordinal one; drop on a saturated window; pass with per-source budgets,
// smooth), and the peers built by deploy/bench/peers.sh, loaded from
// $TIERLIMIT_PEERS_DIR with their maps set up for their normal pass path
// (bench_peers_setup_test.go). All run chunk by chunk in turn
// (bestChunks' method: chunks of 100 ticks, the call's fixed cost
// subtracted), each on its frame (the UDP syslog datagram to 514; for
// L3AF a TCP SYN to its port), each checked for its verdict first.
//
// It reports <name>-ns (ns per packet, fastest chunk) and <name>-x-bare;
// and with the kernel's run-time statistics (statsChunks) <name>-own-ns,
// the run time the kernel counts per run less the bare program's (the
// statistics' own cost per run and the empty program's, subtracted from
// both sides of any ratio of them). A peer whose object is missing is
// left out (no metric), and the log says so. Last, bpftool's profile of
// tierlimit's paths (profileEntries), or the reason it cannot run.
func BenchmarkPeers(b *testing.B) {
	udp, syn := UDP4(b, 514), TCP4(b, l3afPort, true, false)
	es := []peerEntry{{"bare", BareProgram(b, xdpPass), udp, xdpPass, nil}}
	floor, cells := AtomicFloorProgram(b, 1)
	es = append(es, peerEntry{"floor", floor, udp, xdpDrop, nil})
	es = append(es, tierlimitEntries(b, udp)...)
	dir := os.Getenv(peersDirEnv)
	for _, p := range peers {
		if dir == "" {
			b.Logf("peer %s not measured: %s is not set (deploy/bench/peers.sh builds the peers)", p.name, peersDirEnv)
			continue
		}
		prog, err := loadPeer(b, dir, p)
		if errors.Is(err, errNoPeer) {
			b.Logf("peer %s not measured: %v", p.name, err)
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		frame := udp
		if p.tcpSYN {
			frame = syn
		}
		es = append(es, peerEntry{p.name, prog, frame, xdpPass, nil})
	}
	frames := map[*ebpf.Program][]byte{}
	progs := make([]*ebpf.Program, len(es))
	for i, e := range es {
		if got, err := runExact(e.prog, e.frame, 1); err != nil || got != e.want {
			b.Fatalf("%s: verdict %d (%v), want %d: not the path measured", e.name, got, err, e.want)
		}
		frames[e.prog], progs[i] = e.frame, e.prog
	}
	fixed := benchTiming(b).Fixed
	best := chunkMinima(b, func(prog *ebpf.Program, n int) (float64, error) {
		d, err := timeRun(prog, frames[prog], uint32(n))
		return float64((d - fixed).Nanoseconds()) / float64(n), err
	}, progs...)
	checkFloorCells(b, cells, chunkPackets(b))
	st := statsChunks(b, func(prog *ebpf.Program) []byte { return frames[prog] }, progs...)
	// tierlimit's pass paths passed all but at most one in a million of
	// their packets: the path measured was the path named, from the first
	// chunk to the last. (A smooth group within its budget has dropped a
	// handful in 10^8 at the chunks' pauses: <name>-drops reports them.)
	for _, e := range es {
		if e.h == nil || e.want != xdpPass {
			continue
		}
		s := e.h.stats()
		d, n := s.SelectedTotal(tiers.VerdictDrop).Packets, s.SelectedPackets()
		if d*1_000_000 > n {
			b.Fatalf("%s: %d of %d packets dropped, want at most one in a million: the pass path left tier 0", e.name, d, n)
		}
		b.ReportMetric(float64(d), e.name+"-drops")
	}
	for i, e := range es {
		b.ReportMetric(best[i], e.name+"-ns")
		b.ReportMetric(best[i]/best[0], e.name+"-x-bare")
		b.ReportMetric(st.ns[i]-st.ns[0], e.name+"-own-ns")
	}
	b.ReportMetric(st.ns[0], "stats-fixed-ns")
	profileEntries(b, es)
	b.ReportMetric(0, "ns/op")
}

// tierlimitEntries are BenchmarkPeers' tierlimit paths, each on its own
// limiter with its first packet run (a window opened, as in traffic).
func tierlimitEntries(b *testing.B, udp []byte) []peerEntry {
	policy := func(max uint64) tiers.Policy {
		p := ordinalDefault()
		p.Window, p.Max = time.Hour, max
		p.Record = tiers.Record{}
		return p
	}
	within := tiers.Sources{Budget: tiers.Pct(100), PrefixV4: 32, PrefixV6: 64}
	opts := bpf.Options{TickNs: kernelTick(b)}
	var es []peerEntry
	for _, c := range []struct {
		name string
		p    tiers.Policy
		want uint32
	}{
		{"smooth-pass", smooth(policy(benchPassMax)), xdpPass},
		{"ordinal-pass", policy(benchPassMax), xdpPass},
		{"drop", policy(100), xdpDrop},
		{"budgets-pass", smooth(withSources(policy(benchPassMax), within)), xdpPass},
	} {
		h := newHarnessOpts(b, c.p, opts)
		h.expire()
		if c.want == xdpDrop {
			// Saturate the window: 100 packets reach T_last.
			if _, err := runExact(h.l.Program(), udp, 200); err != nil {
				b.Fatal(err)
			}
		}
		es = append(es, peerEntry{c.name, h.l.Program(), udp, c.want, h})
	}
	return es
}
