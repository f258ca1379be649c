package bpf_test

import (
	"testing"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestContract holds every constant, enum and key encoding that tiers (pure
// Go) shares with limiter.c against the C side: the values bpf2go exported
// from types.h and consts.h, and the map sizes in the object's own specs. It
// needs no kernel. Change one side only and it fails.
func TestContract(t *testing.T) {
	eq := func(name string, goSide, cSide uint64) {
		t.Helper()
		if goSide != cSide {
			t.Errorf("%s: Go says %d, C says %d", name, goSide, cSide)
		}
	}
	// Limits.
	eq("tiers.MaxTiers / TL_MAX_TIERS", tiers.MaxTiers, uint64(bpf.LimiterTlConstTL_C_MAX_TIERS))
	eq("tiers.MaxSelectRules / TL_MAX_RULES", tiers.MaxSelectRules, uint64(bpf.LimiterTlConstTL_C_MAX_RULES))
	eq("tiers.MaxTableEntries / TL_TABLE_MAX", tiers.MaxTableEntries, uint64(bpf.LimiterTlConstTL_C_TABLE_MAX))
	eq("bpf.MaxTiers", uint64(bpf.MaxTiers), tiers.MaxTiers)
	eq("bpf.MaxRules", uint64(bpf.MaxRules), tiers.MaxSelectRules)
	eq("bpf.TableMax", uint64(bpf.TableMax), tiers.MaxTableEntries)
	// A rule is one bit of tl_port.cidr_rules and of tl_settings.syn_rules,
	// and fits in the dests tag below the slot.
	if tiers.MaxSelectRules > 32 || tiers.MaxSelectRules > 1<<tiers.DestRuleBits {
		t.Errorf("%d rules do not fit a 32-bit mask and a %d-bit tag", tiers.MaxSelectRules, tiers.DestRuleBits)
	}

	// Enums.
	eq("tiers.VerdictPass / TL_PASS", uint64(tiers.VerdictPass), uint64(bpf.LimiterTlVerdictTL_PASS))
	eq("tiers.VerdictDrop / TL_DROP", uint64(tiers.VerdictDrop), uint64(bpf.LimiterTlVerdictTL_DROP))
	eq("tiers.VerdictWouldDrop / TL_WOULD_DROP", uint64(tiers.VerdictWouldDrop), uint64(bpf.LimiterTlVerdictTL_WOULD_DROP))
	eq("tiers.NumVerdicts / TL_VERDICTS", tiers.NumVerdicts, uint64(bpf.LimiterTlVerdictTL_VERDICTS))
	eq("tiers.ModeEnforce / TL_MODE_ENFORCE", uint64(tiers.ModeEnforce), uint64(bpf.LimiterTlModeTL_MODE_ENFORCE))
	eq("tiers.ModeDryRun / TL_MODE_DRY_RUN", uint64(tiers.ModeDryRun), uint64(bpf.LimiterTlModeTL_MODE_DRY_RUN))
	eq("tiers.ModeOff / TL_MODE_OFF", uint64(tiers.ModeOff), uint64(bpf.LimiterTlModeTL_MODE_OFF))
	eq("tiers.AlwaysDrop / TL_THR_ALWAYS", tiers.AlwaysDrop, uint64(bpf.LimiterTlThrTL_THR_ALWAYS))
	eq("tier 0 threshold / TL_THR_NEVER", uint64(mustCompile(t, tiers.Default()).Drops[0]), uint64(bpf.LimiterTlThrTL_THR_NEVER))

	// Key encodings.
	eq("tiers.PortKeys / TL_PORT_KEYS", tiers.PortKeys, uint64(bpf.LimiterTlConstTL_PORT_KEYS))
	eq("tiers.PortFlagPackets / TL_PORT_PACKETS", tiers.PortFlagPackets, uint64(bpf.LimiterTlPortFlagTL_PORT_PACKETS))
	eq("tiers.PortFlagSYN / TL_PORT_SYN", tiers.PortFlagSYN, uint64(bpf.LimiterTlPortFlagTL_PORT_SYN))
	eq("tiers.LPMTagBits / TL_LPM_TAG_BITS", tiers.LPMTagBits, uint64(bpf.LimiterTlConstTL_LPM_TAG_BITS))
	eq("tiers.LPMAddrBits / TL_LPM_ADDR_BITS", tiers.LPMAddrBits, uint64(bpf.LimiterTlConstTL_LPM_ADDR_BITS))
	eq("tiers.DestRuleBits / TL_DEST_RULE_BITS", tiers.DestRuleBits, uint64(bpf.LimiterTlConstTL_DEST_RULE_BITS))

	// Map sizes, read back from the object's map specs.
	spec, err := bpf.LoadLimiter()
	if err != nil {
		t.Fatal(err)
	}
	size := func(name string) uint64 {
		m, ok := spec.Maps[name]
		if !ok {
			t.Fatalf("the object has no map %q", name)
		}
		return uint64(m.MaxEntries)
	}
	slots := uint64(bpf.LimiterTlConstTL_C_SLOTS)
	eq("tier_table entries / slots × tiers.MaxTableEntries", slots*tiers.MaxTableEntries, size("tier_table"))
	eq("ports entries / slots × 2 protocols × tiers.PortKeys", slots*2*tiers.PortKeys, size("ports"))
	eq("stats entries / (tiers.MaxTiers + 1) × tiers.NumVerdicts", (tiers.MaxTiers+1)*tiers.NumVerdicts, size("stats"))
	eq("settings entries / slots", slots, size("settings"))
	eq("misc_stats entries / TL_MISC_MAX", uint64(bpf.LimiterTlMiscTL_MISC_MAX), size("misc_stats"))
	eq("exempt_sources entries / bpf.PrefixEntries", uint64(bpf.PrefixEntries), size("exempt_sources"))
	eq("select_dests entries / bpf.PrefixEntries", uint64(bpf.PrefixEntries), size("select_dests"))
	eq("frag_verdicts entries / bpf.FragmentEntries", uint64(bpf.FragmentEntries), size("frag_verdicts"))
	eq("overflow entries / TL_MAX_CPUS", uint64(bpf.LimiterTlConstTL_C_MAX_CPUS), size("overflow"))
	// One overflow slot per CPU, two cache lines, so that no two CPUs' counts share one.
	if got := spec.Maps["overflow"].ValueSize; got != 128 {
		t.Errorf("overflow value is %d bytes, want 128 (two cache lines)", got)
	}
	// The slot must fit the tags: exempt tag = slot, dests tag = slot << DestRuleBits | rule.
	if slots<<tiers.DestRuleBits >= 1<<tiers.LPMTagBits {
		t.Errorf("%d slots do not fit the %d-bit LPM tag", slots, tiers.LPMTagBits)
	}
}

func mustCompile(t *testing.T, p tiers.Policy) tiers.Table {
	t.Helper()
	tab, err := tiers.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}
