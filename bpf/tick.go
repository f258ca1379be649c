package bpf

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Tick is the kernel's tick as MeasureTick found it.
type Tick struct {
	// Ns is the tick in ns, as the program's tick gate takes it: 1/HZ
	// rounded up, so that whole ticks in a window are never overstated.
	Ns uint64
	// HZ is the measured rate, ticks per second, before rounding.
	HZ float64
	// ConfigHZ is CONFIG_HZ from the kernel config, 0 when none was read;
	// ConfigPath says where it was read.
	ConfigHZ   uint64
	ConfigPath string
}

// ConfigAgrees reports whether the kernel config's CONFIG_HZ (when there
// is one) is the measured HZ.
func (t Tick) ConfigAgrees() bool {
	return t.ConfigHZ == 0 || t.Ns == uint64(math.Ceil(1e9/float64(t.ConfigHZ)))
}

// MeasureTick reads jiffies for tickSpan and keeps each edge (jiffies
// moving) seen within tickEdge of the read before. An edge is never early,
// only late, by as long as the tick interrupt came late (by milliseconds
// on a loaded VM), so the rate is the slope between the least late edge of
// the span's first third and that of its last third; tickSnap is how close
// (relative) it must be to one of kernelHZ to be taken as that HZ: the
// least late edges are late by tens of µs, an error near 1e-3 over a third
// of 300 ms, while the closest two of kernelHZ (250 and 256, 1000 and
// 1024) are 2.4% apart.
const (
	tickSpan = 300 * time.Millisecond
	tickEdge = 50 * time.Microsecond
	tickSnap = 0.01
)

// kernelHZ are the values Kconfig offers for CONFIG_HZ on any architecture
// (kernel/Kconfig.hz and the arch Kconfigs: alpha, arm, mips, among
// others).
var kernelHZ = []float64{24, 32, 48, 64, 100, 128, 200, 250, 256, 300, 500, 1000, 1024, 1200}

// ErrTick is returned by MeasureTick when jiffies do not move as a tick
// does (they stand still for longer than the slowest tick, HZ 24).
var ErrTick = errors.New("cannot measure the kernel's tick")

// MeasureTick measures the kernel's tick: bpf_jiffies64 (read by a
// two-instruction program run with BPF_PROG_TEST_RUN) against
// CLOCK_MONOTONIC, from one tick's edge to another's tickSpan later (about
// 0.3 s in all). A
// rate within tickSnap of a value Kconfig offers is that HZ; otherwise the
// measured tick is taken, tickSnap longer (the tick gate's safe side). The
// kernel config's CONFIG_HZ, which can be stale (a config file of another
// build) or missing, is only read to compare (Tick.ConfigAgrees): the
// agent logs a disagreement.
func MeasureTick() (Tick, error) {
	return measureTick(configPaths())
}

func measureTick(paths []string) (Tick, error) {
	var t Tick
	for _, path := range paths {
		if hz, err := configHZ(path); err == nil {
			t.ConfigHZ, t.ConfigPath = hz, path
			break
		}
	}
	measured.Do(func() { measured.hz, measured.err = measureRate() })
	if measured.err != nil {
		return t, measured.err
	}
	t.HZ = measured.hz
	if t.HZ <= 0 {
		return t, fmt.Errorf("%w: jiffies did not move in %v", ErrTick, tickSpan)
	}
	t.Ns = uint64(math.Ceil(1e9 / t.HZ * (1 + tickSnap)))
	for _, hz := range kernelHZ {
		if math.Abs(hz-t.HZ) <= hz*tickSnap {
			t.Ns = uint64(math.Ceil(1e9 / hz))
		}
	}
	return t, nil
}

// measured is the kernel's tick rate, measured once per process: the tick
// does not change while the kernel runs.
var measured struct {
	sync.Once
	hz  float64
	err error
}

// measureRate loads a program that returns bpf_jiffies64 and measures the
// tick rate with it (tickRate).
func measureRate() (float64, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "tl_jiffies", Type: ebpf.XDP, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.FnJiffies64.Call(), asm.Return()},
	})
	if err != nil {
		return 0, fmt.Errorf("%w: load a jiffies reader: %w", ErrTick, err)
	}
	defer prog.Close()
	frame := make([]byte, 64)
	return tickRate(func() (uint32, error) { return prog.Run(&ebpf.RunOptions{Data: frame}) })
}

// jiffyEdge is jiffies moving to j at t.
type jiffyEdge struct {
	j uint32
	t time.Time
}

// tickRate reads jiffies for tickSpan and returns ticks per second
// (MeasureTick's const block says how).
func tickRate(read func() (uint32, error)) (float64, error) {
	var edges []jiffyEdge
	j0, err := read()
	start := time.Now()
	for err == nil && time.Since(start) < tickSpan {
		before := time.Now()
		var j uint32
		if j, err = read(); err == nil && j != j0 {
			if now := time.Now(); now.Sub(before) <= tickEdge {
				edges = append(edges, jiffyEdge{j, now})
			}
			j0 = j
		}
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTick, err)
	}
	if len(edges) < 6 {
		return 0, fmt.Errorf("%w: %d clean edges of jiffies in %v", ErrTick, len(edges), tickSpan)
	}
	rate := func(a, b jiffyEdge) float64 { return float64(b.j-a.j) / b.t.Sub(a.t).Seconds() }
	hz := rate(edges[0], edges[len(edges)-1])
	third := len(edges) / 3
	// The least late edge of a run, by its lag behind the line of rate hz
	// through edges[0].
	least := func(run []jiffyEdge) jiffyEdge {
		best, bestLag := run[0], math.Inf(1)
		for _, e := range run {
			lag := e.t.Sub(edges[0].t).Seconds() - float64(e.j-edges[0].j)/hz
			if lag < bestLag {
				best, bestLag = e, lag
			}
		}
		return best
	}
	for range 2 {
		hz = rate(least(edges[:third]), least(edges[len(edges)-third:]))
	}
	return hz, nil
}
