package bpf

import (
	"testing"

	"github.com/tierlimit/tierlimit/tiers"
)

// TestLPMSizeMatchesPolicyLimit: each LPM trie holds tiers.MaxPrefixes (the
// destination trie also tiers.MaxLocalPrefixes) per
// policy slot (consts.h TL_LPM_PREFIXES), so that a policy at the limit can
// be written beside a running one at the limit.
func TestLPMSizeMatchesPolicyLimit(t *testing.T) {
	spec, err := LoadLimiter()
	if err != nil {
		t.Fatal(err)
	}
	slots := spec.Maps["settings"].MaxEntries
	if got, want := spec.Maps["exempt_sources"].MaxEntries, slots*tiers.MaxPrefixes; got != want {
		t.Errorf("exempt_sources holds %d prefixes, want %d slots × tiers.MaxPrefixes = %d", got, slots, want)
	}
	if got, want := spec.Maps["select_dests"].MaxEntries, slots*(tiers.MaxPrefixes+tiers.MaxLocalPrefixes); got != want {
		t.Errorf("select_dests holds %d prefixes, want %d slots × (tiers.MaxPrefixes + tiers.MaxLocalPrefixes) = %d", got, slots, want)
	}
}
