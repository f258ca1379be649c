package bpf

import "github.com/cilium/ebpf"

// FragVerdicts is the frag_verdicts map, for tests that age its entries.
func (l *Limiter) FragVerdicts() *ebpf.Map { return l.objs.FragVerdicts }

// WindowMap is the window map, for tests that read its raw fields.
func (l *Limiter) WindowMap() *ebpf.Map { return l.objs.Window }

// RecordGate is the record_gate map, for tests that check it untouched.
func (l *Limiter) RecordGate() *ebpf.Map { return l.objs.RecordGate }
