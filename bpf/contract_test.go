package bpf_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestContract holds every constant, enum and key encoding that tiers (pure
// Go) shares with the XDP program against the C side: the values bpf2go exported
// from types.h and consts.h, and the map sizes in the object's own specs. It
// needs no kernel. Change one side only and it fails.
//
// Where bpf and tiers both name a limit, they use one name for one meaning:
// MaxTiers, MaxSelectRules, MaxTableEntries, MaxPrefixes, NumVerdicts,
// NumMalformed, SketchRows (and, unexported in bpf, slots, portKeys,
// seedWords, destRuleBits, lpmTagBits, lpmTagIPv6). The pairs whose names
// differ differ in meaning:
//   - bpf.PrefixEntries is the size of each LPM trie (TL_LPM_ENTRIES), which
//     holds both policy slots: TL_SLOTS × MaxPrefixes, the per-policy limit.
//   - tiers.Verdicts is the list of verdicts; NumVerdicts, on both sides, is
//     their count (TL_VERDICTS).
//   - tiers.MaxBudgetPackets is the largest budget a sketch cell can count,
//     derived from the cell's 32 count bits (TL_CELL_COUNT_BITS), not a size.
//   - tiers.TopSources is the size of the source_top table
//     (TL_SRC_TOP_ENTRIES); bpf names no constant for it, and its
//     Limiter.TopSources is the method that reads the table.
//
// Why tiers' mirrors are checked here rather than generated from the C
// header (issue 31): tiers is the lowest layer, pure Go, and may not import
// bpf, where bpf2go exports the header's values; a tiers file generated
// from bpf/*.h would give tiers a second generator and a build step on the
// C sources, and it would still be the header, not the committed object,
// that it copied: a header changed without `make generate` would agree
// with it and not with the program that runs. This test compares tiers
// with what bpf2go exported from the object itself, so one run of
// `go test` proves the program and the pure model agree. And most pairs
// are not constants a generator could copy: they are encodings (port and
// LPM keys, the sketch's rows, the smooth shape's fixed point) that tiers
// computes and the program decodes, which only a test of both can hold.
func TestContract(t *testing.T) {
	eq := func(name string, goSide, cSide uint64) {
		t.Helper()
		if goSide != cSide {
			t.Errorf("%s: Go says %d, C says %d", name, goSide, cSide)
		}
	}
	contractLimits(t, eq)
	contractEnums(t, eq)
	contractKeys(t, eq)
	contractPrefixKeys(t)
	contractMalformed(t, eq)
	contractSmooth(eq)
	contractMapSizes(t, eq)
}

// eqFunc fails the test when the Go side and the C side of name disagree.
type eqFunc func(name string, goSide, cSide uint64)

// contractLimits holds the limits of a policy on both sides.
func contractLimits(t *testing.T, eq eqFunc) {
	t.Helper()
	eq("tiers.MaxTiers / TL_MAX_TIERS", tiers.MaxTiers, uint64(bpf.LimiterTlConstTL_C_MAX_TIERS))
	eq("tiers.MaxSelectRules / TL_MAX_RULES", tiers.MaxSelectRules, uint64(bpf.LimiterTlConstTL_C_MAX_RULES))
	eq("tiers.MaxTableEntries / TL_TABLE_MAX", tiers.MaxTableEntries, uint64(bpf.LimiterTlConstTL_C_TABLE_MAX))
	eq("bpf.MaxTiers", uint64(bpf.MaxTiers), tiers.MaxTiers)
	eq("bpf.MaxSelectRules", uint64(bpf.MaxSelectRules), tiers.MaxSelectRules)
	eq("bpf.MaxTableEntries", uint64(bpf.MaxTableEntries), tiers.MaxTableEntries)
	eq("bpf.NumVerdicts", uint64(bpf.NumVerdicts), tiers.NumVerdicts)
	eq("bpf.MaxPrefixes", uint64(bpf.MaxPrefixes), tiers.MaxPrefixes)
	eq("bpf.PrefixEntries / TL_SLOTS × tiers.MaxPrefixes", uint64(bpf.PrefixEntries), uint64(bpf.LimiterTlConstTL_C_SLOTS)*tiers.MaxPrefixes)
	eq("tiers.RecordSnapMax / TL_RECORD_SNAP_MAX", tiers.RecordSnapMax, uint64(bpf.LimiterTlConstTL_C_RECORD_SNAP_MAX))
	eq("bpf.RecordSnapMax", uint64(bpf.RecordSnapMax), tiers.RecordSnapMax)
	// A rule is one bit of tl_port.cidr_rules and of tl_settings.syn_rules,
	// and fits in the dests tag below the slot.
	if tiers.MaxSelectRules > 32 || tiers.MaxSelectRules > 1<<tiers.DestRuleBits {
		t.Errorf("%d rules do not fit a 32-bit mask and a %d-bit tag", tiers.MaxSelectRules, tiers.DestRuleBits)
	}
}

// contractEnums holds the enums tiers mirrors: verdicts, modes, threshold
// sentinels and severity classes.
func contractEnums(t *testing.T, eq eqFunc) {
	t.Helper()
	eq("tiers.VerdictPass / TL_PASS", uint64(tiers.VerdictPass), uint64(bpf.LimiterTlVerdictTL_PASS))
	eq("tiers.VerdictDrop / TL_DROP", uint64(tiers.VerdictDrop), uint64(bpf.LimiterTlVerdictTL_DROP))
	eq("tiers.VerdictWouldDrop / TL_WOULD_DROP", uint64(tiers.VerdictWouldDrop), uint64(bpf.LimiterTlVerdictTL_WOULD_DROP))
	eq("tiers.NumVerdicts / TL_VERDICTS", tiers.NumVerdicts, uint64(bpf.LimiterTlVerdictTL_VERDICTS))
	eq("tiers.ModeEnforce / TL_MODE_ENFORCE", uint64(tiers.ModeEnforce), uint64(bpf.LimiterTlModeTL_MODE_ENFORCE))
	eq("tiers.ModeDryRun / TL_MODE_DRY_RUN", uint64(tiers.ModeDryRun), uint64(bpf.LimiterTlModeTL_MODE_DRY_RUN))
	eq("tiers.ModeOff / TL_MODE_OFF", uint64(tiers.ModeOff), uint64(bpf.LimiterTlModeTL_MODE_OFF))
	eq("tiers.AlwaysDrop / TL_THR_ALWAYS", tiers.AlwaysDrop, uint64(bpf.LimiterTlThrTL_THR_ALWAYS))
	eq("tiers.SevNormal / TL_SEV_NORMAL", uint64(tiers.SevNormal), uint64(bpf.LimiterTlSevClassTL_SEV_NORMAL))
	eq("tiers.SevProtected / TL_SEV_PROTECTED", uint64(tiers.SevProtected), uint64(bpf.LimiterTlSevClassTL_SEV_PROTECTED))
	eq("tiers.SevShedFirst / TL_SEV_SHED_FIRST", uint64(tiers.SevShedFirst), uint64(bpf.LimiterTlSevClassTL_SEV_SHED_FIRST))
	eq("tiers.NumSeverityClasses / TL_SEV_CLASSES", tiers.NumSeverityClasses, uint64(bpf.LimiterTlSevClassTL_SEV_CLASSES))
	eq("tier 0 threshold / TL_THR_NEVER", uint64(mustCompile(t, ordinalDefault()).Drops[0]), uint64(bpf.LimiterTlThrTL_THR_NEVER))
}

// contractKeys holds the encodings of the ports and LPM keys.
func contractKeys(t *testing.T, eq eqFunc) {
	t.Helper()
	eq("tiers.PortKeys / TL_PORT_KEYS", tiers.PortKeys, uint64(bpf.LimiterTlConstTL_PORT_KEYS))
	eq("tiers.PortFlagPackets / TL_PORT_PACKETS", tiers.PortFlagPackets, uint64(bpf.LimiterTlPortFlagTL_PORT_PACKETS))
	eq("tiers.PortFlagSYN / TL_PORT_SYN", tiers.PortFlagSYN, uint64(bpf.LimiterTlPortFlagTL_PORT_SYN))
	eq("tiers.LPMTagBits / TL_LPM_TAG_BITS", tiers.LPMTagBits, uint64(bpf.LimiterTlConstTL_LPM_TAG_BITS))
	eq("tiers.LPMAddrBits / TL_LPM_ADDR_BITS", tiers.LPMAddrBits, uint64(bpf.LimiterTlConstTL_LPM_ADDR_BITS))
	eq("tiers.DestRuleBits / TL_DEST_RULE_BITS", tiers.DestRuleBits, uint64(bpf.LimiterTlConstTL_DEST_RULE_BITS))
	eq("tiers.LPMTagIPv6 / TL_LPM_TAG_IPV6", tiers.LPMTagIPv6, uint64(bpf.LimiterTlConstTL_LPM_TAG_IPV6))
}

// contractMalformed holds the malformed reasons (tiers.Malformed indexes
// malformed_stats) and the fragment verdicts' lifetime.
func contractMalformed(t *testing.T, eq eqFunc) {
	t.Helper()
	eq("tiers.NumMalformed / TL_MAL_MAX", uint64(tiers.NumMalformed), uint64(bpf.LimiterTlMalformedTL_MAL_MAX))
	eq("bpf.NumMalformed", uint64(bpf.NumMalformed), uint64(tiers.NumMalformed))
	eq("tiers.MalformedIPv4Length / TL_MAL_IPV4_LENGTH", uint64(tiers.MalformedIPv4Length), uint64(bpf.LimiterTlMalformedTL_MAL_IPV4LENGTH))
	eq("tiers.MalformedIPv6Length / TL_MAL_IPV6_LENGTH", uint64(tiers.MalformedIPv6Length), uint64(bpf.LimiterTlMalformedTL_MAL_IPV6LENGTH))
	eq("tiers.MalformedUDPLength / TL_MAL_UDP_LENGTH", uint64(tiers.MalformedUDPLength), uint64(bpf.LimiterTlMalformedTL_MAL_UDP_LENGTH))
	eq("tiers.MalformedTCPLength / TL_MAL_TCP_LENGTH", uint64(tiers.MalformedTCPLength), uint64(bpf.LimiterTlMalformedTL_MAL_TCP_LENGTH))
	eq("tiers.MalformedTinyFragment / TL_MAL_TINY_FRAGMENT", uint64(tiers.MalformedTinyFragment), uint64(bpf.LimiterTlMalformedTL_MAL_TINY_FRAGMENT))
	eq("tiers.MalformedIPv4Checksum / TL_MAL_IPV4_CHECKSUM", uint64(tiers.MalformedIPv4Checksum), uint64(bpf.LimiterTlMalformedTL_MAL_IPV4CHECKSUM))
	eq("len(tiers.MalformedReasons)", uint64(len(tiers.MalformedReasons)), uint64(tiers.NumMalformed))
	// Unclassified reasons: tiers.Unclassified indexes unclassified_stats.
	eq("tiers.NumUnclassified / TL_UNCL_MAX", uint64(tiers.NumUnclassified), uint64(bpf.LimiterTlUnclassifiedTL_UNCL_MAX))
	eq("tiers.UnclassifiedVLANDepth / TL_UNCL_VLAN_DEPTH", uint64(tiers.UnclassifiedVLANDepth), uint64(bpf.LimiterTlUnclassifiedTL_UNCL_VLAN_DEPTH))
	eq("tiers.UnclassifiedIPv6Chain / TL_UNCL_IPV6_CHAIN", uint64(tiers.UnclassifiedIPv6Chain), uint64(bpf.LimiterTlUnclassifiedTL_UNCL_IPV6CHAIN))
	eq("tiers.UnclassifiedFragmentChain / TL_UNCL_FRAGMENT_CHAIN", uint64(tiers.UnclassifiedFragmentChain), uint64(bpf.LimiterTlUnclassifiedTL_UNCL_FRAGMENT_CHAIN))
	eq("len(tiers.UnclassifiedReasons)", uint64(len(tiers.UnclassifiedReasons)), uint64(tiers.NumUnclassified))
	// The kernel gives up reassembly after net.ipv4.ipfrag_time (30 s by
	// default): a verdict must not outlive it.
	if bpf.FragmentTTL <= 0 || bpf.FragmentTTL > 30*time.Second {
		t.Errorf("fragment verdicts live %v, want (0, 30s]", bpf.FragmentTTL)
	}
}

// contractSmooth holds the smooth estimator's constants (docs/design.md §9).
func contractSmooth(eq eqFunc) {
	eq("tiers.SmoothFracBits / TL_SMOOTH_FRAC_BITS", tiers.SmoothFracBits, uint64(bpf.LimiterTlConstTL_C_SMOOTH_FRAC_BITS))
	eq("tiers.SmoothMinFrac / TL_SMOOTH_MIN_FRAC", tiers.SmoothMinFrac, uint64(bpf.LimiterTlConstTL_C_SMOOTH_MIN_FRAC))
	eq("tiers.SmoothOnsetMin / TL_SMOOTH_ONSET_MIN", tiers.SmoothOnsetMin, uint64(bpf.LimiterTlConstTL_C_SMOOTH_ONSET_MIN))
	eq("tiers.SmoothTickShift / TL_SMOOTH_TICK_SHIFT", tiers.SmoothTickShift, uint64(bpf.LimiterTlConstTL_C_SMOOTH_TICK_SHIFT))
	eq("tiers.SmoothProfN / TL_SMOOTH_PROF_N", tiers.SmoothProfN, uint64(bpf.LimiterTlConstTL_C_SMOOTH_PROF_N))
	eq("tiers.SmoothLatchShift / TL_SMOOTH_LATCH_SHIFT", tiers.SmoothLatchShift, uint64(bpf.LimiterTlConstTL_C_SMOOTH_LATCH_SHIFT))
	eq("tiers.SmoothClockBits / TL_SMOOTH_CLOCK_BITS", tiers.SmoothClockBits, uint64(bpf.LimiterTlConstTL_C_SMOOTH_CLOCK_BITS))
	eq("tl_smooth_prof.at / 2 × tiers.SmoothProfN", 2*tiers.SmoothProfN, uint64(len(bpf.LimiterTlSmoothProf{}.At)*len(bpf.LimiterTlSmoothProf{}.At[0])))
}

// contractMapSizes holds the map sizes, read back from the object's map
// specs, and the per-source budgets' sketch and top table.
func contractMapSizes(t *testing.T, eq eqFunc) {
	t.Helper()
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
	eq("select_dests entries / PrefixEntries + slots × tiers.MaxLocalPrefixes", uint64(bpf.PrefixEntries)+uint64(size("settings"))*tiers.MaxLocalPrefixes, size("select_dests"))
	eq("tiers.MaxLocalPrefixes / TL_LOCAL_PREFIXES", tiers.MaxLocalPrefixes, uint64(bpf.LimiterTlConstTL_C_LOCAL_PREFIXES))
	eq("severity_stats entries / classes × verdicts + 2", tiers.NumSeverityClasses*tiers.NumVerdicts+2, size("severity_stats"))
	eq("frag_verdicts entries / bpf.FragmentEntries", uint64(bpf.FragmentEntries), size("frag_verdicts"))
	// Per-source budgets: the sketch, its cells and the top table.
	eq("tiers.SketchRows / TL_SKETCH_ROWS", tiers.SketchRows, uint64(bpf.LimiterTlConstTL_C_SKETCH_ROWS))
	eq("tiers.SketchColBits / TL_SKETCH_COL_BITS", tiers.SketchColBits, uint64(bpf.LimiterTlConstTL_C_SKETCH_COL_BITS))
	eq("tiers.SketchCols / TL_SKETCH_COLS", tiers.SketchCols, uint64(bpf.LimiterTlConstTL_C_SKETCH_COLS))
	eq("tiers.SeedWords / TL_SEED_WORDS", tiers.SeedWords, uint64(bpf.LimiterTlConstTL_SEED_WORDS))
	eq("tl_settings.src_seeds / tiers.SketchRows × tiers.SeedWords", tiers.SketchRows*tiers.SeedWords, uint64(len(bpf.LimiterTlSettings{}.SrcSeeds)))
	eq("tiers.TopSources / TL_SRC_TOP_ENTRIES", tiers.TopSources, uint64(bpf.LimiterTlConstTL_C_SRC_TOP_ENTRIES))
	eq("tiers.SmoothFracBits / TL_SMOOTH_FRAC_BITS", tiers.SmoothFracBits, uint64(bpf.LimiterTlConstTL_C_SMOOTH_FRAC_BITS))
	eq("tiers.SmoothMinFrac / TL_SMOOTH_MIN_FRAC", tiers.SmoothMinFrac, uint64(bpf.LimiterTlConstTL_C_SMOOTH_MIN_FRAC))
	eq("tiers.SmoothOnsetMin / TL_SMOOTH_ONSET_MIN", tiers.SmoothOnsetMin, uint64(bpf.LimiterTlConstTL_C_SMOOTH_ONSET_MIN))
	eq("tiers.SmoothTickShift / TL_SMOOTH_TICK_SHIFT", tiers.SmoothTickShift, uint64(bpf.LimiterTlConstTL_C_SMOOTH_TICK_SHIFT))
	eq("tiers.FleetMultMax / TL_FLEET_MULT_MAX", tiers.FleetMultMax, uint64(1)<<uint64(bpf.LimiterTlConstTL_C_FLEET_MULT_SHIFT))
	eq("tiers.FleetRhatMax / TL_FLEET_RHAT_MAX", tiers.FleetRhatMax, uint64(1)<<uint64(bpf.LimiterTlConstTL_C_FLEET_RHAT_SHIFT))
	eq("tiers.ShapeOrdinal / TL_SHAPE_ORDINAL", uint64(tiers.ShapeOrdinal), uint64(bpf.LimiterTlShapeTL_SHAPE_ORDINAL))
	eq("tiers.ShapeSmooth / TL_SHAPE_SMOOTH", uint64(tiers.ShapeSmooth), uint64(bpf.LimiterTlShapeTL_SHAPE_SMOOTH))
	eq("bpf.SketchRows", uint64(bpf.SketchRows), tiers.SketchRows)
	if v, ok := spec.Variables[bpf.LimiterVarTlSketch]; !ok {
		t.Error("no tl_sketch in the object")
	} else {
		eq("tl_sketch bytes / tiers.SketchRows × tiers.SketchCols × tiers.SketchCellBytes", tiers.SketchRows*tiers.SketchCols*tiers.SketchCellBytes, uint64(v.Size()))
	}
	eq("cell count bits / 32 (tiers.Sketch)", 32, uint64(bpf.LimiterTlConstTL_CELL_COUNT_BITS))
	eq("source_stats entries / tiers.NumVerdicts", tiers.NumVerdicts, size("source_stats"))
	eq("source_top entries / tiers.TopSources", tiers.TopSources, size("source_top"))
	if tiers.SketchCols&(tiers.SketchCols-1) != 0 {
		t.Errorf("tiers.SketchCols %d is not a power of two", tiers.SketchCols)
	}
	eq("malformed_stats entries / tiers.NumMalformed", uint64(tiers.NumMalformed), size("malformed_stats"))
	eq("unclassified_stats entries / tiers.NumUnclassified", uint64(tiers.NumUnclassified), size("unclassified_stats"))
	eq("skb_ifaces entries / bpf.SKBIfaces", uint64(bpf.SKBIfaces), size("skb_ifaces"))
	eq("overflow entries / TL_MAX_CPUS", uint64(bpf.LimiterTlConstTL_C_MAX_CPUS), size("overflow"))
	// One overflow slot per CPU, two cache lines, so that no two CPUs' counts share one.
	if got := spec.Maps["overflow"].ValueSize; got != 128 {
		t.Errorf("overflow value is %d bytes, want 128 (two cache lines)", got)
	}
	// The slot must fit the tags: exempt tag = slot, dests tag = slot << DestRuleBits | rule.
	if slots<<tiers.DestRuleBits >= 1<<tiers.LPMTagBits {
		t.Errorf("%d slots do not fit the %d-bit LPM tag", slots, tiers.LPMTagBits)
	}
	// ... and below the family bit.
	if slots<<tiers.DestRuleBits > tiers.LPMTagIPv6 || tiers.LPMTagIPv6 >= 1<<tiers.LPMTagBits {
		t.Errorf("the family bit %#x overlaps the slot and rule of the tag, or leaves it", tiers.LPMTagIPv6)
	}
}

// contractPrefixKeys holds the LPM key encoding: IPv4 as IPv4-mapped with
// 96 more bits, IPv6 as is, the family in the tag, and Prefix reads back
// what the config said.
func contractPrefixKeys(t *testing.T) {
	p := ordinalDefault()
	p.Exempt = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	p.Select = append(p.Select, tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 9, Last: 9}}, Dests: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("::/0")}})
	tab := mustCompile(t, p)
	want := []struct {
		bits uint32
		tag  uint32
		addr netip.Addr
	}{
		{tiers.LPMTagBits + 96, 0, netip.MustParseAddr("::ffff:0.0.0.0")},
		{tiers.LPMTagBits, tiers.LPMTagIPv6, netip.MustParseAddr("::")},
		{tiers.LPMTagBits + 120, 0, netip.MustParseAddr("::ffff:192.0.2.0")},
		{tiers.LPMTagBits + 32, tiers.LPMTagIPv6, netip.MustParseAddr("2001:db8::")},
	}
	for i, k := range tab.Selectors.Exempt {
		w := want[i]
		if k.Prefixlen != w.bits || k.Tag != w.tag || k.Addr != w.addr.As16() {
			t.Errorf("exempt %v: key {%d %#x %v}, want {%d %#x %v}", p.Exempt[i], k.Prefixlen, k.Tag, netip.AddrFrom16(k.Addr), w.bits, w.tag, w.addr)
		}
		if k.Prefix() != p.Exempt[i] {
			t.Errorf("exempt %v: key reads back as %v", p.Exempt[i], k.Prefix())
		}
	}
	rule := uint32(len(p.Select) - 1)
	for i, k := range tab.Selectors.Dests {
		d := p.Select[rule].Dests[i]
		fam := uint32(0)
		if d.Addr().Is6() {
			fam = tiers.LPMTagIPv6
		}
		if k.Tag != fam || k.Prefix() != d || k.Rules&(1<<rule) == 0 {
			t.Errorf("dests %v: tag %#x rules %#x reads back as %v, want tag %#x and rule %d", d, k.Tag, k.Rules, k.Prefix(), fam, rule)
		}
	}
}

func mustCompile(t *testing.T, p tiers.Policy) tiers.Table {
	t.Helper()
	tab, err := tiers.Compile(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}
