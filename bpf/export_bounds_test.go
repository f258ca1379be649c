package bpf

import "github.com/cilium/ebpf"

// SlotMaps are the active_slot and settings maps, for a test program that
// reads a slot as the limiter does.
func (l *Limiter) SlotMaps() (active, settings *ebpf.Map) { return l.objs.ActiveSlot, l.objs.Settings }

// MeasureTickFrom is MeasureTick with the kernel config read from paths.
func MeasureTickFrom(paths []string) (Tick, error) { return measureTick(paths) }

// MeasureRate measures the tick rate afresh (MeasureTick measures once).
func MeasureRate() (float64, error) { return measureRate() }
