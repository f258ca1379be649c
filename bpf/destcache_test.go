package bpf_test

import (
	"net/netip"
	"testing"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestDestCacheAcrossReloads: a destination the trie held is not counted
// once a reload has taken it out, though each CPU's dest_cache answered
// for it, and the slot it was cached for is written again two reloads on.
func TestDestCacheAcrossReloads(t *testing.T) {
	with := ordinalDefault().WithLocal([]netip.Prefix{netip.MustParsePrefix("198.51.100.1/32")})
	without := ordinalDefault().WithLocal([]netip.Prefix{netip.MustParsePrefix("198.51.100.2/32")})
	h := newHarness(t, with)
	frame := UDP4(t, 514) // to 198.51.100.1
	count := func(what string, want uint64) {
		t.Helper()
		s0 := h.stats()
		for range 3 { // on the CPU the test runs on, twice from the cache
			h.run(frame)
		}
		s1 := h.stats()
		if got := s1.SelectedPackets() - s0.SelectedPackets(); got != want {
			t.Errorf("%s: %d of 3 counted, want %d", what, got, want)
		}
	}
	count("destination in the policy", 3)
	h.apply(with) // the other slot
	count("the same policy in the other slot", 3)
	h.apply(without) // the first slot again, without the destination
	count("destination reloaded away", 0)
	h.apply(with)
	h.apply(with)
	count("destination back", 3)
	if c := tiers.Classify(h.p, frame); c.Class != tiers.ClassSelected {
		t.Errorf("classifier: %v", c.Class)
	}
}
