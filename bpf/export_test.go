package bpf

import "github.com/cilium/ebpf"

// FragVerdicts is the frag_verdicts map, for tests that age its entries.
func (l *Limiter) FragVerdicts() *ebpf.Map { return l.objs.FragVerdicts }

// WindowMap is the window map, for tests that read its raw fields.
func (l *Limiter) WindowMap() *ebpf.Map { return l.objs.Window }

// RecordGate is the record_gate map, for tests that check it untouched.
func (l *Limiter) RecordGate() *ebpf.Map { return l.objs.RecordGate }

// MapNamed is the limiter's map of that name (maps.h), for a benchmark
// that runs another build of the program on the same maps.
func (l *Limiter) MapNamed(name string) *ebpf.Map { return l.mapNamed(name) }

// JudgeProgram is the tail-called judgement (limiter.c tl_judge_tail), for
// the sampled profile.
func (l *Limiter) JudgeProgram() *ebpf.Program { return l.objs.TlJudgeTail }
