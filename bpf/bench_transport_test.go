//go:build tlperf

package bpf_test

import (
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// transportChunk is how many packets, every one sampled, a chunk of
// BenchmarkRecordTransport runs: under what the ring (1 MiB) and each
// CPU's perf buffer (1 MiB) hold, so that none is lost while the reader
// waits.
const transportChunk = 2048

// BenchmarkRecordTransport measures the choice of docs/design.md §10's sample
// transport: the ring buffer the program uses (bpf_ringbuf_reserve, the
// frame copied into place, submit) against a perf event array (the perf
// build, gen.go's third line: the sample's header from a per-CPU scratch,
// bpf_perf_event_output appending the frame's bytes), each read by its
// cilium/ebpf reader (ringbuf.Reader, perf.Reader) and decoded as the
// agent decodes. The drop path, with every packet sampled (the gate reset
// before each chunk, the cap at its most), so that a chunk's cost over
// the same path with sampling off is the cost of a sample; the readers
// then read the chunk's samples, timed. Chunk by chunk in the same run
// (at most transportChunks), best chunk of each. It reports ns per sample
// in the program (ring-, perf-, perf-batch-) and in the reader (-read-),
// and each perf variant over the ring (x-ring: above 1, the ring buffer
// is cheaper). Program times are the kernel's (kernelTime).
func BenchmarkRecordTransport(b *testing.B) {
	policy := func(samples uint32) tiers.Policy {
		p := dropPolicy()
		p.Record = tiers.Record{Samples: samples, Snaplen: tiers.RecordSnapMax}
		return p
	}
	opts := bpf.Options{TickNs: kernelTick(b)}
	ring := newHarnessOpts(b, policy(tiers.MaxRecordSamples), opts)
	off := newHarnessOpts(b, policy(0), opts)
	frame := UDP4(b, 514)
	transports := newTransports(b, ring, policy(tiers.MaxRecordSamples), opts)
	for _, h := range []*harness{off, transports[0].h, transports[1].h, transports[2].h} {
		h.expire()
		h.repeat(frame, 200) // saturated: the 100% tier from n = 100
		if got := h.run(frame); got != xdpDrop {
			b.Fatalf("the benchmark frame gets %d, want XDP_DROP", got)
		}
	}
	for _, t := range transports {
		drainAll(b, t.h, t.read)
	}

	offBest := math.Inf(1)
	prog := []float64{math.Inf(1), math.Inf(1), math.Inf(1)}
	read := []float64{math.Inf(1), math.Inf(1), math.Inf(1)}
	for done := 0; done < min(b.N, transportChunks*transportChunk); done += transportChunk {
		d, err := kernelTime(off.l.Program(), frame, transportChunk)
		if err != nil {
			b.Fatal(err)
		}
		offBest = min(offBest, float64(d.Nanoseconds()))
		for i, t := range transports {
			p, r := transportChunkRun(b, t.h, frame, t.read)
			prog[i], read[i] = min(prog[i], p), min(read[i], r)
		}
	}
	b.ReportMetric(offBest, "off-ns/pkt")
	for i, t := range transports {
		b.ReportMetric(prog[i]-offBest, t.name+"-ns/sample")
		b.ReportMetric(read[i], t.name+"-read-ns/sample")
		if i > 0 {
			b.ReportMetric((prog[i]-offBest)/(prog[0]-offBest), t.name+"-x-ring")
			b.ReportMetric(read[i]/read[0], t.name+"-read-x-ring")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// newTransports are the benchmark's transports: ring's (the ring buffer),
// then perf and perf-batch, two limiters of the perf build with policy p.
func newTransports(b *testing.B, ring *harness, p tiers.Policy, opts bpf.Options) []transport {
	b.Helper()
	rrd, err := ring.l.Samples()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rrd.Close() })
	transports := []transport{{"ring", ring, func() error {
		_, err := rrd.Read()
		return err
	}}}
	// perf: the reader woken at every sample (perf.NewReader's default);
	// perf-batch: every transportWakeup samples, as the ring's adaptive
	// wakeup wakes it about once a chunk.
	for _, wakeup := range []int{0, transportWakeup} {
		pl, err := bpf.LoadPerf(opts)
		if err != nil {
			b.Fatal(err)
		}
		h := newHarnessWith(b, p, pl)
		prd, err := h.l.PerfSamples(1<<20, wakeup)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { prd.Close() })
		name := "perf"
		if wakeup > 0 {
			name = "perf-batch"
		}
		transports = append(transports, transport{name, h, func() error {
			rec, err := prd.Read()
			if err != nil {
				return err
			}
			if rec.LostSamples != 0 {
				b.Fatalf("perf reader: %d samples lost", rec.LostSamples)
			}
			_, err = bpf.DecodePerfSample(rec.RawSample)
			return err
		}})
	}
	return transports
}

// transportChunks bounds the chunks of one measurement, whatever b.N: a
// chunk of each transport costs about 20 ms (the perf reader woken at
// every sample, the readers' decoding), and the best of 128 is as good a
// figure as the best of 2048 (make bench's 4194304 packets).
const transportChunks = 128

// transportWakeup is perf-batch's wakeup: every this many samples.
const transportWakeup = 64

// transport is one way of carrying samples: its limiter and its reader's
// read of one sample.
type transport struct {
	name string
	h    *harness
	read func() error
}

// transportChunkRun runs one chunk of h's program, every packet sampled,
// and reads the chunk's samples with read: ns per packet in the program,
// ns per sample in the reader.
func transportChunkRun(b *testing.B, h *harness, frame []byte, read func() error) (prog, reader float64) {
	b.Helper()
	if err := h.l.RecordGate().Put(uint32(0), bpf.LimiterTlRecordGate{}); err != nil {
		b.Fatal(err)
	}
	s0, l0, _ := h.l.RecordCounts()
	d, err := kernelTime(h.l.Program(), frame, transportChunk)
	if err != nil {
		b.Fatal(err)
	}
	s1, l1, err := h.l.RecordCounts()
	if err != nil || s1-s0 != transportChunk || l1 != l0 {
		b.Fatalf("a chunk of %d packets: %d sampled, %d lost (%v); want every one sampled", transportChunk, s1-s0, l1-l0, err)
	}
	start := time.Now()
	for range transportChunk {
		if err := read(); err != nil {
			b.Fatal(err)
		}
	}
	r := time.Since(start)
	return float64(d.Nanoseconds()), float64(r.Nanoseconds()) / transportChunk
}

// kernelTime runs prog repeat times on frame, as runExact does (SIGURG
// blocked: no batch run twice), and returns the kernel's time per run
// (BPF_PROG_TEST_RUN's duration, which leaves out the call's own cost: a
// chunk small enough for the buffers would otherwise be mostly that).
func kernelTime(prog *ebpf.Program, frame []byte, repeat uint32) (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var block, old unix.Sigset_t
	block.Val[0] = 1 << (uint(unix.SIGURG) - 1)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &block, &old); err != nil {
		return 0, err
	}
	defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	_, d, err := prog.Benchmark(frame, int(repeat), nil)
	return d, err
}

// drainAll reads every sample h's program has written so far.
func drainAll(b *testing.B, h *harness, read func() error) {
	b.Helper()
	n, _, err := h.l.RecordCounts()
	if err != nil {
		b.Fatal(err)
	}
	for range n {
		if err := read(); err != nil {
			b.Fatal(err)
		}
	}
}
