package bpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/tiers"
)

// writeSelectors fills the slot's port array and LPM tries with what
// tiers.Compile encoded, adding the slot to each key. The port array is
// written whole, in two batches, so the time is bounded whatever the number
// of ranges (Compile merges them); the tries are written through their
// mirrors, so an unchanged reload writes no prefix. ctx ends a long trie
// write between prefixes.
func (l *Limiter) writeSelectors(ctx context.Context, slot uint32, sel tiers.Selectors) error {
	keys := make([]uint32, 2*portKeys)
	vals := make([]LimiterTlPort, 2*portKeys)
	for i := range keys {
		keys[i] = slot*2*portKeys + uint32(i)
	}
	for _, ps := range sel.Ports {
		vals[ps.Key] = LimiterTlPort{Flags: ps.Flags, CidrRules: ps.CidrRules}
	}
	if err := putAll(l.objs.Ports, keys, vals); err != nil {
		return fmt.Errorf("write ports of slot %d: %w", slot, err)
	}
	dests := make(map[LimiterTlLpmKey]uint32, len(sel.Dests))
	perRule := l.objs.SelectDests.ValueSize() == 1 // a layout-1 object (LoadObject)
	for _, k := range sel.Dests {
		key := LimiterTlLpmKey{Prefixlen: k.Prefixlen, Tag: slot<<destRuleBits | k.Tag, Addr: k.Addr}
		if !perRule {
			dests[key] = k.Rules
			continue
		}
		// Up to layout 1, one entry per rule and destination, the rule's
		// number in the tag.
		for i := range uint32(32) {
			if k.Rules&(1<<i) != 0 {
				r := key
				r.Tag |= i
				dests[r] = 1
			}
		}
	}
	destSlot := func(tag uint32) uint32 { return (tag &^ lpmTagIPv6) >> destRuleBits }
	if err := l.dests.sync(ctx, l.objs.SelectDests, destSlot, slot, dests); err != nil {
		return fmt.Errorf("write select dests of slot %d: %w", slot, err)
	}
	exempt := make(map[LimiterTlLpmKey]uint32, len(sel.Exempt))
	for _, k := range sel.Exempt {
		exempt[LimiterTlLpmKey{Prefixlen: k.Prefixlen, Tag: slot | k.Tag, Addr: k.Addr}] = 1
	}
	exemptSlot := func(tag uint32) uint32 { return tag &^ lpmTagIPv6 }
	if err := l.exempt.sync(ctx, l.objs.ExemptSources, exemptSlot, slot, exempt); err != nil {
		return fmt.Errorf("write exempt sources of slot %d: %w", slot, err)
	}
	return nil
}

// clearDestCache empties every CPU's dest_cache: the answers it holds for
// the slot just written are stale (maps.h dest_cache). Called before the
// flip, so that after it no packet of the new policy reads one.
func (l *Limiter) clearDestCache() error {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("possible CPUs: %w", err)
	}
	if err := l.objs.DestCache.Put(uint32(0), make([]LimiterTlDestCache, n)); err != nil {
		return fmt.Errorf("clear dest_cache: %w", err)
	}
	return nil
}

// lpmMirror is what an LPM trie holds, per slot: keys and values
// (select_dests: the rules, a u32; exempt_sources: 1, a u8). Iterating a
// trie costs tens of µs per key, so it is read once, on the first Apply
// after Load, and kept in step with every write after that.
type lpmMirror struct {
	loaded bool
	slots  [2]map[LimiterTlLpmKey]uint32
}

// sync makes slot's entries in m (slotOf maps a tag to its slot) exactly
// want: it deletes the keys that are not wanted, then writes the missing
// ones and those whose value changed, so an unchanged policy costs no map
// write and the trie never holds more than both slots' policies.
func (mr *lpmMirror) sync(ctx context.Context, m *ebpf.Map, slotOf func(tag uint32) uint32, slot uint32, want map[LimiterTlLpmKey]uint32) error {
	if !mr.loaded {
		if err := mr.load(m, slotOf); err != nil {
			return err
		}
	}
	have := mr.slots[slot&1]
	n := 0
	for k := range have {
		if _, ok := want[k]; ok {
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
	for k, v := range want {
		if old, ok := have[k]; ok && old == v {
			continue
		}
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if err := m.Put(&k, lpmValue(m, v)); err != nil {
			return fmt.Errorf("prefix %v/%d: %w", netip.AddrFrom16(k.Addr), k.Prefixlen-lpmTagBits, err)
		}
		have[k] = v
	}
	return nil
}

// lpmValue is v as m's values are: a u32, or a u8.
func lpmValue(m *ebpf.Map, v uint32) any {
	if m.ValueSize() == 1 {
		return uint8(v)
	}
	return v
}

func (mr *lpmMirror) load(m *ebpf.Map, slotOf func(tag uint32) uint32) error {
	mr.slots = [2]map[LimiterTlLpmKey]uint32{{}, {}}
	var k LimiterTlLpmKey
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		var x uint32
		for i, b := range v { // little-endian, as the program (bpfel)
			x |= uint32(b) << (8 * i)
		}
		mr.slots[slotOf(k.Tag)&1][k] = x
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
