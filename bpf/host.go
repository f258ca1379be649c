package bpf

import (
	"encoding/binary"
	"fmt"
	"net"
)

// IfaceSlots is how many interfaces the program can tell apart
// (TL_IFACES): each is described in slot ifindex % IfaceSlots, and one
// whose slot another holds is not checked (SetIfaces).
const IfaceSlots = int(LimiterTlConstTL_C_IFACES)

// Iface is what the program checks of the frames arriving on one interface
// (bpf/host.h, docs/design.md §2 "The kernel is the oracle"): a selected frame
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
// earlier description, and returns the ifindexes it left out: an
// interface whose slot (ifindex % IfaceSlots) an earlier one in ifs holds
// is not checked, and its frames are counted as without the checks. The
// checks are off while it writes: a packet meanwhile is counted, never
// passed uncounted by a half-written entry. Like SetSKBIfaces, the
// description lives with the loaded program: call it after every load
// and attach.
func (l *Limiter) SetIfaces(ifs []Iface) (unchecked []int, err error) {
	var (
		idx   [IfaceSlots]uint32
		words [IfaceSlots]uint64
		used  [IfaceSlots]bool
		n     uint32
	)
	for _, ifc := range ifs {
		i := ifc.Index % IfaceSlots
		if used[i] || ifc.Index <= 0 {
			unchecked = append(unchecked, ifc.Index)
			continue
		}
		used[i], idx[i], words[i] = true, uint32(ifc.Index), ifc.word()
		n++
	}
	if err := l.objs.TlIfCount.Set(uint32(0)); err != nil {
		return nil, fmt.Errorf("set tl_if_count: %w", err)
	}
	if err := l.objs.TlIfWord.Set(words); err != nil {
		return nil, fmt.Errorf("set tl_if_word: %w", err)
	}
	if err := l.objs.TlIfIndex.Set(idx); err != nil {
		return nil, fmt.Errorf("set tl_if_index: %w", err)
	}
	if err := l.objs.TlIfCount.Set(n); err != nil {
		return nil, fmt.Errorf("set tl_if_count: %w", err)
	}
	return unchecked, nil
}
