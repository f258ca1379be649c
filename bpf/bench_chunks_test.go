package bpf_test

import (
	"compress/gzip"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// The chunks every benchmark of this package runs (issue 42 item 1).
//
// A BPF_PROG_TEST_RUN call's wall time is quantized to the kernel's tick
// on hosts like the one issue 42 measured (Linux 6.18, HZ=250): a call
// pays a fixed cost that ends on a tick (for XDP the kernel swaps the
// program into the XDP dispatcher around the loop, and each swap waits
// for an RCU grace period, which ends on a tick), so a call of 1 packet
// and a call of 131,072 both take a whole number of ticks. A chunk's wall
// time over its packets then moves in steps of a tick over the chunk:
// 30.5 ns at 131,072 packets. So the chunk is sized from the host, as
// measured once per process (benchTiming): it spans at least benchTicks
// ticks of the bare program's work, so a step is at most 1/benchTicks of
// the fastest program's figure, and the call's least fixed cost (a call
// of a few packets) is subtracted from every chunk's wall time.

// benchTicksEnv overrides benchTicks (make bench-quick sets a few: CI's
// smoke run, no figures).
const benchTicksEnv = "TIERLIMIT_BENCH_TICKS"

// benchTicks is how many quanta of the host's clock a chunk of the bare
// program spans at the least.
const benchTicks = 100

// benchMinChunks is how many chunks each program runs in one measurement
// at the least, whatever b.N: its figure is its fastest.
const benchMinChunks = 2

// hostTiming is how BPF_PROG_TEST_RUN's wall time behaves on this host,
// measured by benchTiming.
type hostTiming struct {
	// Quantum is the step of a call's wall time (the tick), 0 when the
	// calls' ends showed none.
	Quantum time.Duration
	// ConfigHZ is CONFIG_HZ from /proc/config.gz, 0 when unknown: stated
	// beside Quantum, never used for it.
	ConfigHZ int
	// Fixed is the least wall time of a call of quantumPackets of the
	// bare program: what every call costs besides its packets (the
	// packets' own few µs included, a bias of under 0.1 % of a chunk).
	Fixed time.Duration
	// BareNs is the bare XDP_DROP's ns per packet over a call of
	// sizingPackets: the least of its wall time less Fixed and the
	// kernel's own figure, over three calls. The chunk is sized from it.
	BareNs float64
	// Ticks is how many quanta a chunk of the bare program spans, of the
	// coarser of Quantum and CONFIG_HZ's tick.
	Ticks int
	// Chunk is the packets of one chunk.
	Chunk int
}

const (
	// quantumCalls is how many back-to-back calls of quantumPackets
	// benchTiming times to find the quantum.
	quantumCalls = 64
	// quantumPackets is the packets of those calls: more than one, since
	// the kernel swaps the program into the XDP dispatcher only for a
	// repeat of more than one (bpf_prog_test_run_xdp), and few enough
	// that the call is nearly all fixed cost.
	quantumPackets = 1024
	// quantumPause bounds the random pause before each of those calls.
	quantumPause = 7 * time.Millisecond
	// quantumCoherence is the least phase coherence of the calls' gaps
	// that counts as a quantum (quantumOf).
	quantumCoherence = 0.5
	// quantumPeak is the share of the best coherence a larger q needs to
	// be taken over a smaller one (its divisors cohere at least as well).
	quantumPeak = 0.75
	// sizingPackets is the call benchTiming sizes the chunk from.
	sizingPackets = 1 << 22
	// fallbackChunk is the chunk when no quantum shows (a host whose
	// calls are not on a tick grid): 2^21 packets, the figure.
	fallbackChunk = 1 << 21
)

var (
	timingOnce sync.Once
	timing     hostTiming
	timingErr  error
)

// benchTiming measures the host's timing once per process (about 1 s)
// and returns it; it fails tb when BPF_PROG_TEST_RUN does.
func benchTiming(tb testing.TB) hostTiming {
	tb.Helper()
	Require(tb)
	timingOnce.Do(func() { timing, timingErr = measureTiming(tb) })
	if timingErr != nil || timing.Chunk == 0 {
		tb.Fatalf("measure the host's BPF_PROG_TEST_RUN timing: %v", timingErr)
	}
	return timing
}

// measureTiming is benchTiming's measurement, on programs and a frame
// made for tb (the first benchmark to ask).
func measureTiming(tb testing.TB) (hostTiming, error) {
	prog := BareProgram(tb, xdpDrop)
	frame := UDP4(tb, 514)
	t := hostTiming{ConfigHZ: configHZ(), Ticks: benchTicks}
	if s := os.Getenv(benchTicksEnv); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			t.Ticks = n
		}
	}
	// Calls of a few packets (quantumPackets: microseconds of work),
	// nearly all fixed cost, each after a random pause of up to
	// quantumPause so that they start at random phases of the tick. Their
	// ends are whole quanta apart when the cost ends on a tick.
	ends := make([]time.Time, 0, quantumCalls)
	t.Fixed = time.Duration(math.MaxInt64)
	for range quantumCalls {
		time.Sleep(rand.N(quantumPause))
		start := time.Now()
		if _, err := runExact(prog, frame, quantumPackets); err != nil {
			return hostTiming{}, err
		}
		end := time.Now()
		t.Fixed = min(t.Fixed, end.Sub(start))
		ends = append(ends, end)
	}
	var gaps []time.Duration
	for i := 1; i < len(ends); i++ {
		gaps = append(gaps, ends[i].Sub(ends[i-1]))
	}
	t.Quantum = quantumOf(gaps)
	// The kernel's own figure for the call (whole ns per packet, rounded
	// down, and without the time other jobs took the CPU) beside the wall
	// time's: the less of the two, so that a loaded machine does not
	// shrink the chunk.
	best := math.Inf(1)
	for range 3 {
		start := time.Now()
		_, per, err := prog.Benchmark(frame, sizingPackets, nil)
		d := time.Since(start)
		if err != nil {
			return hostTiming{}, err
		}
		wall := float64((d - t.Fixed).Nanoseconds()) / sizingPackets
		best = min(best, wall, max(float64(per.Nanoseconds()), 1))
	}
	t.BareNs = max(best, 0.5)
	t.Chunk = fallbackChunk
	if t.Quantum > 0 {
		// On a loaded machine the calls' ends can fall on a finer grid
		// than the tick (a fraction of it: measured 2.0 ms at HZ=250 while
		// other jobs ran; likely the ticks of two CPUs, half a tick apart).
		// The chunk spans Ticks of the coarser of the two, so that it
		// spans Ticks of the tick whatever grid this run measured.
		step := float64(t.Quantum.Nanoseconds())
		if t.ConfigHZ > 0 {
			step = max(step, 1e9/float64(t.ConfigHZ))
		}
		n := float64(t.Ticks) * step / t.BareNs
		// Rounded up to a multiple of 2^16 packets.
		t.Chunk = int(math.Ceil(n/65536)) * 65536
	}
	return t, nil
}

// quantumOf returns the quantum of the gaps between calls' ends: the
// largest q (0.5 to 25 ms, and not above the least gap, in steps of
// 0.5 %) whose phase coherence
// |Σ exp(2πi·gap/q)| / n is at least quantumPeak of the best over that range, and
// at least quantumCoherence; 0 when no q reaches it (the calls do not end
// on a grid). A gap that other jobs moved off the grid only lowers the
// coherence of every q; a multiple of the true quantum (2q) loses its
// coherence on the gaps that are odd multiples of q.
func quantumOf(gaps []time.Duration) time.Duration {
	coherence := func(q float64) float64 {
		var re, im float64
		for _, g := range gaps {
			ph := 2 * math.Pi * float64(g.Nanoseconds()) / q
			re += math.Cos(ph)
			im += math.Sin(ph)
		}
		return math.Hypot(re, im) / float64(len(gaps))
	}
	var qs, cs []float64
	best := 0.0
	// No q above the least gap: a q far above every gap coheres for any
	// gaps that are close together.
	qMax := 25e6
	for _, g := range gaps {
		qMax = min(qMax, 1.03*float64(g.Nanoseconds()))
	}
	for q := qMax; q >= 0.5e6; q *= 0.995 {
		c := coherence(q)
		qs, cs = append(qs, q), append(cs, c)
		best = max(best, c)
	}
	if best < quantumCoherence {
		return 0
	}
	for i, c := range cs {
		if c < quantumPeak*best {
			continue
		}
		// The peak of this lobe: on down the grid while above the bar,
		// then on a finer grid around it.
		top := i
		for j := i; j < len(cs) && cs[j] >= quantumPeak*best; j++ {
			if cs[j] > cs[top] {
				top = j
			}
		}
		q, cq := qs[top], cs[top]
		for f := 0.995; f <= 1.005; f += 0.0002 {
			if x := coherence(qs[top] * f); x > cq {
				q, cq = qs[top]*f, x
			}
		}
		return time.Duration(q)
	}
	return 0
}

// configHZ reads CONFIG_HZ from /proc/config.gz; 0 when it cannot.
func configHZ() int {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return 0
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return 0
	}
	b, err := io.ReadAll(z)
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`(?m)^CONFIG_HZ=(\d+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	hz, _ := strconv.Atoi(string(m[1]))
	return hz
}

// chunkRounds is how many chunks of chunk packets cover n, at least
// benchMinChunks.
func chunkRounds(n, chunk int) int {
	return max(benchMinChunks, (n+chunk-1)/chunk)
}

// BenchmarkTiming reports the host's timing that every chunk here is
// sized by (benchTiming): quantum-ms (the tick measured), config-hz,
// fixed-ms (a call's least fixed cost), bare-ns (the bare program's ns
// per packet it was sized from), ticks and chunk (packets); and, with
// the kernel's run-time statistics on (BPF_ENABLE_STATS, through its file
// descriptor), stats-fixed-ns: the run time the kernel counts for each
// run of the bare program, which is the statistics' own cost per run (two
// sched_clock reads around a program of two instructions), and
// stats-wall-ns, what the statistics add to a run's wall time.
func BenchmarkTiming(b *testing.B) {
	t := benchTiming(b)
	b.ReportMetric(float64(t.Quantum.Nanoseconds())/1e6, "quantum-ms")
	b.ReportMetric(float64(t.ConfigHZ), "config-hz")
	b.ReportMetric(float64(t.Fixed.Nanoseconds())/1e6, "fixed-ms")
	b.ReportMetric(t.BareNs, "bare-ns")
	b.ReportMetric(float64(t.Ticks), "ticks")
	b.ReportMetric(float64(t.Chunk), "chunk")
	bare := BareProgram(b, xdpDrop)
	frame := UDP4(b, 514)
	off := bestChunks(b, frame, bare)[0]
	st := statsChunks(b, func(*ebpf.Program) []byte { return frame }, bare)
	b.ReportMetric(st.ns[0], "stats-fixed-ns")
	b.ReportMetric(st.wall[0]-off, "stats-wall-ns")
	b.ReportMetric(0, "ns/op")
}

// statsTimes are statsChunks' figures per program: the kernel's run time
// per run (ns) and the wall ns per packet with the statistics on, each the
// fastest chunk's.
type statsTimes struct {
	ns, wall []float64
}

// statsChunks runs progs in turn chunk by chunk as bestChunks does, each
// on frame(prog), with
// the kernel's run-time statistics on (ebpf.EnableStats: BPF_ENABLE_STATS
// through a file descriptor, closed after, not the global sysctl), and
// returns each program's least run time per run as the kernel counts it
// (ProgramStats.Runtime over RunCount within the chunk), and its wall
// time. The statistics time each run with sched_clock, not the tick, so
// they need no long chunks; their own cost per run is in each figure
// (BenchmarkTiming's stats-fixed-ns), to be subtracted from both sides of
// a ratio.
func statsChunks(b *testing.B, frame func(*ebpf.Program) []byte, progs ...*ebpf.Program) statsTimes {
	b.Helper()
	closer, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable the kernel's run-time statistics (BPF_ENABLE_STATS): %v", err)
	}
	defer closer.Close()
	t := benchTiming(b)
	st := statsTimes{ns: inf(len(progs)), wall: inf(len(progs))}
	for range chunkRounds(b.N, t.Chunk) {
		for i, prog := range progs {
			s0, err := prog.Stats()
			if err != nil {
				b.Fatal(err)
			}
			d, err := timeRun(prog, frame(prog), uint32(t.Chunk))
			if err != nil {
				b.Fatal(err)
			}
			s1, err := prog.Stats()
			if err != nil {
				b.Fatal(err)
			}
			runs := s1.RunCount - s0.RunCount
			if runs == 0 {
				b.Fatalf("program %d: the kernel's statistics counted no run of a chunk of %d", i, t.Chunk)
			}
			st.ns[i] = min(st.ns[i], float64((s1.Runtime-s0.Runtime).Nanoseconds())/float64(runs))
			st.wall[i] = min(st.wall[i], float64((d-t.Fixed).Nanoseconds())/float64(t.Chunk))
		}
	}
	return st
}

func inf(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = math.Inf(1)
	}
	return v
}

// TestQuantumOf checks quantumOf on gaps made as the calls' ends make
// them: whole ticks with jitter and a few calls delayed off the grid, and
// gaps on no grid.
func TestQuantumOf(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tick := range []time.Duration{time.Millisecond, 3333333, 4 * time.Millisecond, 10 * time.Millisecond} {
		var gaps []time.Duration
		for i := range quantumCalls {
			g := time.Duration(3+r.IntN(7))*tick + time.Duration(r.IntN(80_000)-40_000)
			if i%10 == 0 { // delayed off the grid by another job
				g += time.Duration(r.Int64N(int64(tick)))
			}
			gaps = append(gaps, g)
		}
		if q := quantumOf(gaps); math.Abs(float64(q-tick)) > 0.01*float64(tick) {
			t.Errorf("tick %v: quantum %v, want it within 1 %%", tick, q)
		}
	}
	var gaps []time.Duration
	for range quantumCalls {
		gaps = append(gaps, 10*time.Millisecond+time.Duration(r.Int64N(int64(10*time.Millisecond))))
	}
	if q := quantumOf(gaps); q != 0 {
		t.Errorf("gaps on no grid: quantum %v, want 0", q)
	}
}

// benchPassMax is the max of the benchmarks' pass paths (a window of an
// hour): tiers.MaxPackets, 2^40. Its tier 0 holds 7.7·10^11 packets, and
// its pass rate (3·10^8 a second) is far above any test run's, so that
// the smooth shape's estimate stays below T_1 (q = 0) and a pass path
// stays on tier 0, a group within its budget, however long the chunks.
// At 10^8 the tick-sized chunks took BenchmarkStages' sources-pass group
// over its budget; at 2^36 (1.9·10^7 a second) smooth-pass dropped 1.7 %.
const benchPassMax = tiers.MaxPackets
