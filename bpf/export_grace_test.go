package bpf

import "github.com/cilium/ebpf"

// SlotMaps are the active_slot and settings maps, for a test program that
// reads a slot as the limiter does.
func (l *Limiter) SlotMaps() (active, settings *ebpf.Map) { return l.objs.ActiveSlot, l.objs.Settings }
