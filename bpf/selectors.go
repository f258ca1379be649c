package bpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/tiers"
)

// writeSelectors fills the slot's port array and LPM tries and returns the
// syn_rules mask. The port array is written whole, in two batches: the time
// is bounded (about 130k entries) whatever the number of ranges, since each
// rule's ranges are merged first.
func (l *Limiter) writeSelectors(ctx context.Context, slot uint32, p tiers.Policy) (uint32, error) {
	keys := make([]uint32, 2*numPorts)
	for i := range keys {
		keys[i] = slot*2*numPorts + uint32(i)
	}
	vals, synRules := portEntries(p)
	var dests []LimiterTlLpmKey
	for i, r := range p.Select {
		for _, d := range r.Dests {
			dests = append(dests, lpmKey(slot<<8|uint32(i), d))
		}
	}
	if err := putAll(l.objs.Ports, keys, vals); err != nil {
		return 0, fmt.Errorf("write ports of slot %d: %w", slot, err)
	}
	if err := l.dests.sync(ctx, l.objs.SelectDests, func(tag uint32) uint32 { return tag >> 8 }, slot, dests); err != nil {
		return 0, fmt.Errorf("write select dests of slot %d: %w", slot, err)
	}
	var exempt []LimiterTlLpmKey
	for _, e := range p.Exempt {
		exempt = append(exempt, lpmKey(slot, e))
	}
	if err := l.exempt.sync(ctx, l.objs.ExemptSources, func(tag uint32) uint32 { return tag }, slot, exempt); err != nil {
		return 0, fmt.Errorf("write exempt sources of slot %d: %w", slot, err)
	}
	return synRules, nil
}

// numPorts is the number of port entries per protocol.
const numPorts = 65536

// portEntries is one slot's port array: UDP ports, then TCP ports. Each
// rule's ranges are sorted and merged, so overlapping ranges cost nothing.
func portEntries(p tiers.Policy) ([]LimiterTlPort, uint32) {
	vals := make([]LimiterTlPort, 2*numPorts)
	var synRules uint32
	for i, r := range p.Select {
		half := 0
		if r.Proto == tiers.ProtoTCP {
			half = numPorts
		}
		for _, pr := range mergeRanges(r.Ports) {
			for port := int(pr.First); port <= int(pr.Last); port++ {
				v := &vals[half+port]
				switch {
				case len(r.Dests) > 0:
					v.CidrRules |= 1 << i
				case r.Count == tiers.CountSYN:
					v.Flags |= portSYN
				default:
					v.Flags |= portPackets
				}
			}
		}
		if len(r.Dests) > 0 && r.Count == tiers.CountSYN {
			synRules |= 1 << i
		}
	}
	return vals, synRules
}

// mergeRanges returns rs sorted by First with overlapping and adjacent
// ranges joined.
func mergeRanges(rs []tiers.PortRange) []tiers.PortRange {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b tiers.PortRange) int { return int(a.First) - int(b.First) })
	out := s[:0]
	for _, r := range s {
		if n := len(out); n > 0 && int(r.First) <= int(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// lpmKey encodes a prefix as the program looks it up: IPv4 as IPv4-mapped
// IPv6 (RFC 4291 §2.5.5.2), prefixlen counting the 32-bit tag.
func lpmKey(tag uint32, pfx netip.Prefix) LimiterTlLpmKey {
	pfx = pfx.Masked()
	bits := pfx.Bits()
	if pfx.Addr().Is4() {
		bits += 96
	}
	return LimiterTlLpmKey{Prefixlen: uint32(32 + bits), Tag: tag, Addr: pfx.Addr().As16()}
}

// lpmMirror is what an LPM trie holds, per slot. Iterating a trie costs
// tens of µs per key, so it is read once, on the first Apply after Load,
// and kept in step with every write after that.
type lpmMirror struct {
	loaded bool
	slots  [2]map[LimiterTlLpmKey]struct{}
}

// sync makes slot's keys in m (slotOf maps a tag to its slot) exactly
// want: it deletes the keys that are not wanted, then inserts the missing
// ones, so an unchanged policy costs no map write and the trie never holds
// more than both slots' policies.
func (mr *lpmMirror) sync(ctx context.Context, m *ebpf.Map, slotOf func(tag uint32) uint32, slot uint32, want []LimiterTlLpmKey) error {
	if !mr.loaded {
		if err := mr.load(m, slotOf); err != nil {
			return err
		}
	}
	have := mr.slots[slot&1]
	wantSet := make(map[LimiterTlLpmKey]struct{}, len(want))
	for _, k := range want {
		wantSet[k] = struct{}{}
	}
	n := 0
	for k := range have {
		if _, ok := wantSet[k]; ok {
			continue
		}
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		delete(have, k)
	}
	for _, k := range want {
		if _, ok := have[k]; ok {
			continue
		}
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if err := m.Put(&k, uint8(1)); err != nil {
			return fmt.Errorf("prefix %v/%d: %w", netip.AddrFrom16(k.Addr), k.Prefixlen-32, err)
		}
		have[k] = struct{}{}
	}
	return nil
}

func (mr *lpmMirror) load(m *ebpf.Map, slotOf func(tag uint32) uint32) error {
	mr.slots = [2]map[LimiterTlLpmKey]struct{}{{}, {}}
	var (
		k LimiterTlLpmKey
		v uint8
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		mr.slots[slotOf(k.Tag)&1][k] = struct{}{}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read LPM trie: %w", err)
	}
	mr.loaded = true
	return nil
}

// putAll writes an array map in batches, one element at a time where the
// kernel has no batch operations.
func putAll[V any](m *ebpf.Map, keys []uint32, vals []V) error {
	const chunk = 1 << 16
	for i := 0; i < len(keys); i += chunk {
		j := min(i+chunk, len(keys))
		_, err := m.BatchUpdate(keys[i:j], vals[i:j], nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			for x := i; x < j; x++ {
				if err := m.Put(keys[x], &vals[x]); err != nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}
