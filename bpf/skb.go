package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// SKBIfaces is the most interfaces SetSKBIfaces takes (TL_SKB_IFACES).
const SKBIfaces = int(LimiterTlConstTL_C_SKB_IFACES)

// ErrSKBIfaces is returned by SetSKBIfaces for more than SKBIfaces
// interfaces.
var ErrSKBIfaces = errors.New("too many interfaces in generic XDP mode")

// ErrSuperPackets is returned by SetSKBIfaces when the kernel cannot show
// the program a super-packet's segment count: it lacks the kfuncs
// bpf_cast_to_kern_ctx and bpf_rdonly_cast (Linux >= 6.2 with BTF). In
// generic mode the program would then count each UDP GSO/GRO super-packet
// as one datagram.
var ErrSuperPackets = errors.New("this kernel cannot count UDP GSO/GRO super-packets in generic XDP mode (needs Linux 6.2 or later with BTF)")

// superPackets reports whether the running kernel has the kfuncs that
// super_segments (segments.h) calls.
func superPackets() error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("%w: kernel BTF: %v", ErrSuperPackets, err)
	}
	for _, name := range []string{"bpf_cast_to_kern_ctx", "bpf_rdonly_cast"} {
		var fn *btf.Func
		if err := spec.TypeByName(name, &fn); err != nil {
			return fmt.Errorf("%w: kfunc %s: %v", ErrSuperPackets, name, err)
		}
	}
	return nil
}

// SetSKBIfaces tells the program the interfaces (by ifindex) it runs on in
// generic (skb) mode, replacing the earlier list. There a frame can be a
// UDP GSO or GRO super-packet, and the program counts the datagrams it
// carries (skb_shared_info.gso_segs) instead of 1; in native mode a frame
// is one datagram, and the program never looks. Call it after every
// attach: the list lives with the loaded program, not in the pinned maps.
// Returns ErrSKBIfaces beyond SKBIfaces interfaces, and ErrSuperPackets
// for any interface on a kernel where the program cannot count them.
func (l *Limiter) SetSKBIfaces(ifindexes []int) error {
	if len(ifindexes) > SKBIfaces {
		return fmt.Errorf("%w: %d, at most %d", ErrSKBIfaces, len(ifindexes), SKBIfaces)
	}
	if len(ifindexes) > 0 {
		if err := superPackets(); err != nil {
			return err
		}
	}
	want := map[uint32]bool{}
	for _, i := range ifindexes {
		want[uint32(i)] = true
	}
	var (
		k     uint32
		v     uint8
		stale []uint32
	)
	it := l.objs.SkbIfaces.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read skb_ifaces: %w", err)
	}
	// Add, set the gate, then delete: a packet meanwhile at worst looks up
	// an interface that is on its way out of the map.
	for k := range want {
		if err := l.objs.SkbIfaces.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("write skb_ifaces[%d]: %w", k, err)
		}
	}
	if err := l.objs.TlSkbIfaces.Set(uint32(len(want))); err != nil {
		return fmt.Errorf("set tl_skb_ifaces: %w", err)
	}
	for _, k := range stale {
		if err := l.objs.SkbIfaces.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete skb_ifaces[%d]: %w", k, err)
		}
	}
	return nil
}
