package bpf

import (
	"fmt"

	"github.com/cilium/ebpf/link"
)

// XDPHook is the XDP attach point of a driver.
type XDPHook int

const (
	// HookNative is the driver's own XDP hook (XDP_FLAGS_DRV_MODE).
	HookNative XDPHook = iota
	// HookGeneric is the kernel's skb-based hook (XDP_FLAGS_SKB_MODE),
	// which every device has.
	HookGeneric
)

// AttachXDP attaches the program to the interface with index ifindex, in
// the caller's network namespace, through a bpf_link (Linux >= 5.9). The
// link detaches when it is closed, unless it was pinned first. Returns an
// error wrapping ebpf.ErrNotSupported where the kernel has no XDP bpf_link,
// and the kernel's errno otherwise (EOPNOTSUPP: the driver has no native
// hook; EBUSY: another program holds the interface).
func (l *Limiter) AttachXDP(ifindex int, hook XDPHook) (link.Link, error) {
	flags := link.XDPDriverMode
	if hook == HookGeneric {
		flags = link.XDPGenericMode
	}
	lk, err := link.AttachXDP(link.XDPOptions{Program: l.objs.Tierlimit, Interface: ifindex, Flags: flags})
	if err != nil {
		return nil, fmt.Errorf("attach xdp to ifindex %d: %w", ifindex, err)
	}
	return lk, nil
}
