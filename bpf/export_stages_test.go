//go:build tlstages

package bpf

import "fmt"

// LoadStage is Load for a benchmark that stops every packet at stage
// (verdict.h TL_STAGE): the program, built with its stage stops, returns
// XDP_DROP there. Stage 0 loads the limiter itself. The stage build's
// bindings (limiterstages_bpfel.go) carry the build tag tlstages.
func LoadStage(opts Options, stage LimiterTlStage) (*Limiter, error) {
	if stage == 0 {
		return Load(opts)
	}
	spec, err := loadLimiterStages()
	if err != nil {
		return nil, err
	}
	v, ok := spec.Variables["tl_bench_stage"]
	if !ok {
		return nil, fmt.Errorf("stages spec has no tl_bench_stage")
	}
	if err := v.Set(uint32(stage)); err != nil {
		return nil, err
	}
	return load(opts, spec)
}
