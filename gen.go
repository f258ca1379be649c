// Package tierlimit is the root of the tierlimit module: an XDP tiered load
// shedder for log collectors. The code lives in tiers/, bpf/, agent/ and
// cmd/tierlimit; this file only holds the bpf2go generate line.
//
// Run `make generate`: it pins the compiler (BPF2GO_CC) and flags
// (BPF2GO_CFLAGS) that produced the committed objects. The second line
// builds the same program with its benchmark stage stops (bpf/verdict.h
// TL_STAGE), unexported, for bpf's BenchmarkStages only: its bindings
// carry the build tag tlstages, so no build compiles them unless asked
// (make bench: go test -c -tags tlstages ./bpf). The third builds it with
// its samples sent through a perf event array instead of the ring buffer
// (maps.h TL_RECORD_PERF), for bpf's BenchmarkRecordTransport only, behind
// the build tag tlperf: the measurement behind the ring buffer's choice.
package tierlimit

//go:generate go tool bpf2go -output-dir bpf -go-package bpf -target bpfel -type tl_stat -type tl_window -type tl_settings -type tl_entry -type tl_port -type tl_lpm_key -type tl_frag_key -type tl_const -type tl_thr -type tl_verdict -type tl_mode -type tl_misc -type tl_bytes_stat -type tl_port_flag -type tl_settings_flag -type tl_sev_class -type tl_sev_stat -type tl_src_key -type tl_src_top -type tl_src_run -type tl_malformed -type tl_frag_verdict -type tl_overflow -type tl_stage -type tl_shape -type tl_smooth_cpu -type tl_smooth_prof -type tl_sample -type tl_record_cpu -type tl_record_gate -type tl_reason -type tl_unclassified -type tl_dest_cache -type tl_if_flag Limiter bpf/limiter.c
//go:generate go tool bpf2go -output-dir bpf -go-package bpf -target bpfel -no-global-types -tags tlstages limiterStages bpf/limiter.c -- -DTL_BENCH_STAGES
//go:generate go tool bpf2go -output-dir bpf -go-package bpf -target bpfel -no-global-types -tags tlperf limiterPerf bpf/limiter.c -- -DTL_RECORD_PERF
