package bpf

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// grace waits for RCU grace periods, so that Apply overwrites a slot only
// once no packet can still be reading it.
//
// The wait is the kernel's own: an update of a map-in-map's outer map
// (BPF_MAP_TYPE_ARRAY_OF_MAPS) returns to user space only after
// synchronize_rcu (kernel/bpf/syscall.c, maybe_wait_bpf_programs, since
// Linux 4.18), so that a program that could still hold the old inner map
// has finished. Every run of the program is inside an RCU read-side
// critical section that synchronize_rcu waits for: native XDP runs in the
// driver's NAPI poll, in softirq with bottom halves disabled, which since
// the RCU flavours were consolidated (Linux 4.20) is a read-side section
// of the one RCU that synchronize_rcu waits for, and the drivers'
// bpf_prog_run_xdp calls are also under rcu_read_lock where the kernel
// needs it (PREEMPT_RT); generic XDP runs from netif_receive_skb_core
// under rcu_read_lock; BPF_PROG_TEST_RUN runs it under rcu_read_lock
// (bpf_test_timer_enter). A packet reads active_slot once, at the start of
// such a section, so every packet that read the old slot number before the
// flip has finished when a grace period that began after the flip ends,
// however long it was stalled (a preempted vCPU, PREEMPT_RT).
// TestApplyWaitsForStalledReader holds a reader on a slot for 150 ms.
type grace struct {
	outer, inner *ebpf.Map
}

func newGrace() (*grace, error) {
	innerSpec := &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1}
	inner, err := ebpf.NewMap(innerSpec)
	if err != nil {
		return nil, fmt.Errorf("grace period map: %w", err)
	}
	outer, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: 1, InnerMap: innerSpec})
	if err != nil {
		inner.Close()
		return nil, fmt.Errorf("grace period map: %w", err)
	}
	return &grace{outer: outer, inner: inner}, nil
}

// wait returns after an RCU grace period that began after it was called.
func (g *grace) wait() error {
	if err := g.outer.Put(uint32(0), g.inner); err != nil {
		return fmt.Errorf("wait for an RCU grace period: %w", err)
	}
	return nil
}

func (g *grace) close() {
	g.outer.Close()
	g.inner.Close()
}
