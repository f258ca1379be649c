package bpf

import (
	"encoding/binary"
	"fmt"
	"net"
)

// MaxIfaces is the most interfaces SetIfaces describes (TL_IFACES): the
// program does not check frames on any further one, and counts them as it
// would without the checks.
const MaxIfaces = int(LimiterTlConstTL_C_IFACES)

// Iface is what the program checks of the frames arriving on one interface
// (bpf/host.h, DESIGN.md §2 "The kernel is the oracle"): a selected frame
// that Linux certainly discards passes uncounted, as unselected.
type Iface struct {
	Index int
	MAC   net.HardwareAddr
	// CheckMAC: a unicast frame not to MAC is another host's (the kernel
	// marks it PACKET_OTHERHOST and IP discards it). Only when no other
	// device takes such frames from this one (no master, no macvlan,
	// macvtap or VLAN children with MACs of their own, not promiscuous).
	CheckMAC bool
	// Martians: the IPv4 and IPv6 addresses Linux always discards on a
	// device that is neither loopback nor an L3 master.
	Martians bool
	// LocalnetMartian: 127.0.0.0/8 too (net.ipv4.conf.{all,IF}.route_localnet
	// both 0, the default).
	LocalnetMartian bool
}

// word is the program's tl_if_word for i: the MAC as a little-endian load
// of a frame's six destination bytes reads it, and the flags above.
func (i Iface) word() uint64 {
	var w uint64
	if len(i.MAC) == 6 {
		w = uint64(binary.LittleEndian.Uint32(i.MAC)) | uint64(binary.LittleEndian.Uint16(i.MAC[4:]))<<32
	}
	var f uint64
	if i.CheckMAC && len(i.MAC) == 6 {
		f |= uint64(LimiterTlIfFlagTL_IF_MAC)
	}
	if i.Martians {
		f |= uint64(LimiterTlIfFlagTL_IF_MARTIAN)
		if i.LocalnetMartian {
			f |= uint64(LimiterTlIfFlagTL_IF_LOCALNET)
		}
	}
	return w | f<<uint64(LimiterTlIfFlagTL_IF_FLAG_SHIFT)
}

// SetIfaces describes the interfaces the program runs on, replacing the
// earlier description; interfaces past MaxIfaces are left out (their
// frames are counted unchecked). The checks are off while it writes: a
// packet meanwhile is counted, as without them, never passed uncounted by
// a half-written entry. Like SetSKBIfaces, the description lives with the
// loaded program: call it after every load and attach.
func (l *Limiter) SetIfaces(ifs []Iface) error {
	var (
		idx   [MaxIfaces]uint32
		words [MaxIfaces]uint64
	)
	n := min(len(ifs), MaxIfaces)
	for i := range n {
		idx[i], words[i] = uint32(ifs[i].Index), ifs[i].word()
	}
	if err := l.objs.TlIfCount.Set(uint32(0)); err != nil {
		return fmt.Errorf("set tl_if_count: %w", err)
	}
	if err := l.objs.TlIfWord.Set(words); err != nil {
		return fmt.Errorf("set tl_if_word: %w", err)
	}
	if err := l.objs.TlIfIndex.Set(idx); err != nil {
		return fmt.Errorf("set tl_if_index: %w", err)
	}
	if err := l.objs.TlIfCount.Set(uint32(n)); err != nil {
		return fmt.Errorf("set tl_if_count: %w", err)
	}
	return nil
}
