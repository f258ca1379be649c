package bpf

import (
	"testing"

	"github.com/tierlimit/tierlimit/tiers"
)

// TestLPMSizeMatchesPolicyLimit: each LPM trie holds tiers.MaxPrefixes per
// policy slot (consts.h TL_LPM_PREFIXES), so that a policy at the limit can
// be written beside a running one at the limit.
func TestLPMSizeMatchesPolicyLimit(t *testing.T) {
	spec, err := LoadLimiter()
	if err != nil {
		t.Fatal(err)
	}
	slots := spec.Maps["settings"].MaxEntries
	for _, name := range []string{"exempt_sources", "select_dests"} {
		if got, want := spec.Maps[name].MaxEntries, slots*tiers.MaxPrefixes; got != want {
			t.Errorf("%s holds %d prefixes, want %d slots × tiers.MaxPrefixes = %d", name, got, slots, want)
		}
	}
}
