//go:build tlperf

package bpf

import (
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf/perf"
)

// LoadPerf is Load for BenchmarkRecordTransport: the program built with
// its samples sent through a perf event array instead of the ring buffer
// (maps.h TL_RECORD_PERF; gen.go's third line, whose bindings carry the
// build tag tlperf).
func LoadPerf(opts Options) (*Limiter, error) {
	spec, err := loadLimiterPerf()
	if err != nil {
		return nil, err
	}
	return load(opts, spec)
}

// PerfSamples opens a reader of the perf build's shed_samples with
// perCPU bytes of buffer on each CPU, woken every wakeupEvents samples
// (0: every sample, perf.NewReader's default).
func (l *Limiter) PerfSamples(perCPU, wakeupEvents int) (*perf.Reader, error) {
	rd, err := perf.NewReaderWithOptions(l.objs.ShedSamples, perCPU, perf.ReaderOptions{WakeupEvents: wakeupEvents})
	if err != nil {
		return nil, fmt.Errorf("open shed_samples (perf): %w", err)
	}
	return rd, nil
}

// DecodePerfSample decodes one record of the perf build: the sample's
// header, then the frame's first caplen bytes.
func DecodePerfSample(raw []byte) (Sample, error) {
	var buf [unsafe.Sizeof(LimiterTlSample{})]byte
	copy(buf[:], raw)
	return DecodeSample(buf[:])
}
