package tiers

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func TestParseSources(t *testing.T) {
	for _, c := range []struct {
		src  string
		want Sources
		pkts uint32
	}{
		{"max: 1000\nsources: {budget: 10%}", Sources{Budget: Pct(10), PrefixV4: 32, PrefixV6: 64}, 100},
		{"max: 1000\nsources: {budget: 12.5%, prefix_v4: 24, prefix_v6: 48}", Sources{Budget: MustParsePercent("12.5"), PrefixV4: 24, PrefixV6: 48}, 125},
		{"max: 1000\nsources: {budget: 250}", Sources{BudgetPackets: 250, PrefixV4: 32, PrefixV6: 64}, 250},
		{"max: 1000\nsources:\n  budget: 100%\n  prefix_v6: 128", Sources{Budget: Pct(100), PrefixV4: 32, PrefixV6: 128}, 1000},
		{"max: 1000\nsources:", Sources{}, 0},
	} {
		p, err := ParseYAML([]byte(c.src))
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		if p.Sources != c.want {
			t.Errorf("%q: Sources = %+v, want %+v", c.src, p.Sources, c.want)
		}
		tab := mustCompile(t, p)
		if tab.Sources.Budget != c.pkts {
			t.Errorf("%q: compiled budget %d, want %d", c.src, tab.Sources.Budget, c.pkts)
		}
	}
}

func TestParseSourcesInvalid(t *testing.T) {
	for _, c := range []struct {
		src  string
		want error
		key  string
		line int
	}{
		{"max: 1000\nsources: {prefix_v4: 24}", ErrMissingKey, "sources.budget", 2},
		{"max: 1000\nsources:\n  budget: 0%", ErrBudget, "sources.budget", 3},
		{"max: 1000\nsources:\n  budget: 0", ErrBudget, "sources.budget", 3},
		{"max: 1000\nsources:\n  budget: 101%", ErrBudget, "sources.budget", 3},
		{"max: 1000\nsources:\n  budget: 1001", ErrBudget, "sources.budget", 3},
		{"max: 1000\nsources:\n  budget: 0.01%", ErrBudget, "sources.budget", 3}, // 0.1 packet
		{"max: 1000\nsources:\n  budget: 12.5", ErrType, "sources.budget", 3},
		{"max: 1000\nsources:\n  budget: ten", ErrType, "sources.budget", 3},
		{"max: 1000\nsources:\n  budget: 1e2%", ErrType, "sources.budget", 3},
		{"max: 1000\nsources:\n  budget: 10%\n  prefix_v4: 33", ErrPrefixLen, "sources.prefix_v4", 4},
		{"max: 1000\nsources:\n  budget: 10%\n  prefix_v4: 0", ErrPrefixLen, "sources.prefix_v4", 4},
		{"max: 1000\nsources:\n  budget: 10%\n  prefix_v6: 129", ErrPrefixLen, "sources.prefix_v6", 4},
		{"max: 1000\nsources:\n  budget: 10%\n  prefix_v6: /64", ErrType, "sources.prefix_v6", 4},
		{"max: 1000\nsources:\n  budget: 10%\n  prefix: 24", ErrUnknownKey, "sources.prefix", 4},
		{"max: 1000\nsources:\n  budget: 10%\n  budget: 5%", ErrDuplicateKey, "sources.budget", 4},
		{"max: 1000\nsources: [10%]", ErrType, "sources", 2},
	} {
		_, err := ParseYAML([]byte(c.src))
		t.Run(c.src, func(t *testing.T) { checkConfigError(t, err, c.want, c.key, c.line) })
	}
	// Validate catches what Go code builds.
	p := Default()
	p.Sources = Sources{Budget: Pct(10), BudgetPackets: 5, PrefixV4: 32, PrefixV6: 64}
	checkConfigError(t, p.Validate(), ErrBudget, "sources.budget", 0)
	p.Sources = Sources{Budget: Pct(10), PrefixV6: 64}
	checkConfigError(t, p.Validate(), ErrPrefixLen, "sources.prefix_v4", 0)
}

func TestCompileSourcesMasks(t *testing.T) {
	p := Default()
	p.Sources = Sources{BudgetPackets: 7, PrefixV4: 20, PrefixV6: 33}
	b := mustCompile(t, p).Sources
	var m4 [4]byte
	binary.LittleEndian.PutUint32(m4[:], b.Mask4)
	if m4 != [4]byte{0xff, 0xff, 0xf0, 0} {
		t.Errorf("Mask4 bytes %x, want fffff000", m4)
	}
	var m6 [16]byte
	for i, w := range b.Mask6 {
		binary.LittleEndian.PutUint32(m6[4*i:], w)
	}
	if m6 != [16]byte{0xff, 0xff, 0xff, 0xff, 0x80} {
		t.Errorf("Mask6 bytes %x, want /33", m6)
	}
	if g := b.Group(netip.MustParseAddr("10.1.31.9")); g != netip.MustParsePrefix("10.1.16.0/20") {
		t.Errorf("Group(10.1.31.9) = %v", g)
	}
	if g := b.Group(netip.MustParseAddr("2001:db8:ffff::1")); g != netip.MustParsePrefix("2001:db8:8000::/33") {
		t.Errorf("Group(2001:db8:ffff::1) = %v", g)
	}
	if g := (SourceBudget{}).Group(netip.MustParseAddr("10.0.0.1")); g.IsValid() {
		t.Errorf("Group with sources off = %v, want none", g)
	}
}

// TestGroupTransition is issue 25 §6: IPv6 sources that carry an IPv4
// sender's address (NAT64's well-known prefix, IPv4-mapped, 6to4) are
// grouped as that IPv4 address under prefix_v4, so that the IPv4 senders
// behind one relay are not one IPv6 group; other IPv6 sources, and NAT64
// prefixes that do not say where the address sits, stay IPv6.
func TestGroupTransition(t *testing.T) {
	b := SourceBudget{Budget: 10, PrefixV4: 24, PrefixV6: 64}
	for _, c := range []struct{ src, want string }{
		{"64:ff9b::10.1.2.3", "10.1.2.0/24"},
		{"64:ff9b::a01:3ff", "10.1.3.0/24"},
		{"::ffff:10.1.2.3", "10.1.2.0/24"},
		{"2002:a01:203::1", "10.1.2.0/24"},
		{"2002:c000:201:7::9", "192.0.2.0/24"},
		{"64:ff9b:1::a01:203", "64:ff9b:1::/64"},
		{"64:ff9b::1:a01:203", "64:ff9b::/64"}, // not in the /96
		{"2001:db8::10.1.2.3", "2001:db8::/64"},
		{"2003::1", "2003::/64"},
		{"10.1.2.3", "10.1.2.0/24"},
	} {
		if g := b.Group(netip.MustParseAddr(c.src)); g != netip.MustParsePrefix(c.want) {
			t.Errorf("Group(%s) = %v, want %s", c.src, g, c.want)
		}
	}
}

func TestSourceColumn(t *testing.T) {
	// By hand: 10.0.0.1 is bytes 0a 00 00 01, loaded little-endian
	// 0x0100000a; (3 × 0x0100000a + 5) >> (64 - SketchColBits) is 0.
	a := [SeedWords]uint64{3, 0, 0, 0, 0, 5}
	if got := SourceColumn(netip.MustParsePrefix("10.0.0.1/32"), a); got != 0 {
		t.Errorf("column %d, want 0", got)
	}
	a = [SeedWords]uint64{1 << 32, 0, 0, 0, 1 << 62, 0}
	// IPv6 adds a_4: 2^62 >> (64 - SketchColBits) = 2^(SketchColBits - 2).
	if got, want := SourceColumn(netip.MustParsePrefix("::/128"), a), uint32(1)<<(SketchColBits-2); got != want {
		t.Errorf("IPv6 ::/128 column %d, want %d", got, want)
	}
	// IPv4 has no a_4: 0x0100000a << 32 >> (64 - SketchColBits) =
	// 0x0100000a >> (32 - SketchColBits).
	if got, want := SourceColumn(netip.MustParsePrefix("10.0.0.1/32"), a), uint32(0x0100000a>>(32-SketchColBits)); got != want {
		t.Errorf("IPv4 column %d, want %d", got, want)
	}

	// Strongly universal: over random seeds, two fixed groups (of either
	// family) share a column with probability 1/SketchCols.
	r := rand.New(rand.NewPCG(3, 4))
	pairs := [][2]netip.Prefix{
		{netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32")},
		{netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("::a00:1/128")},
		{netip.MustParsePrefix("2001:db8::/64"), netip.MustParsePrefix("2001:db8:0:1::/64")},
	}
	const trials = 400000
	for _, pr := range pairs {
		same := 0
		for range trials {
			var a [SeedWords]uint64
			for i := range a {
				a[i] = r.Uint64()
			}
			if SourceColumn(pr[0], a) == SourceColumn(pr[1], a) {
				same++
			}
		}
		p := 1.0 / SketchCols
		if dev := math.Abs(float64(same) - trials*p); dev > 5*math.Sqrt(trials*p*(1-p)) {
			t.Errorf("%v and %v share a column in %d of %d seeds, want about %.0f", pr[0], pr[1], same, trials, trials*p)
		}
	}
}

func randomSeeds(r *rand.Rand) SketchSeeds {
	var s SketchSeeds
	for i := range s {
		for j := range s[i] {
			s[i][j] = r.Uint64()
		}
	}
	return s
}

func TestSketchNeverUnderestimates(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := NewSketch(randomSeeds(r))
	truth := map[netip.Prefix]uint32{}
	for i := range 200000 {
		var a [4]byte
		binary.LittleEndian.PutUint32(a[:], r.Uint32()%50000)
		g := netip.PrefixFrom(netip.AddrFrom4(a), 32)
		if i%3 == 0 {
			g = netip.MustParsePrefix("192.0.2.1/32") // one heavy group
		}
		truth[g]++
		if est := s.Add(g, 1); est < truth[g] {
			t.Fatalf("packet %d: estimate %d < true count %d", i, est, truth[g])
		}
	}
	// A new window starts every cell afresh.
	if est := s.Add(netip.MustParsePrefix("192.0.2.1/32"), 2); est != 1 {
		t.Errorf("first packet of the next window: estimate %d, want 1", est)
	}
}

func TestSketchFalsePositive(t *testing.T) {
	if a, b := SketchFalsePositive(0); a != 0 || b != 0 {
		t.Error("no heavy group, yet a false positive")
	}
	// One heavy group: all SketchRows cells must be its: (1/SketchCols)^SketchRows.
	if got, union := SketchFalsePositive(1); math.Abs(got-math.Pow(1.0/SketchCols, SketchRows)) > 1e-6*got || union != got {
		t.Errorf("SketchFalsePositive(1) = %g, %g, want (1/%d)^%d", got, union, SketchCols, SketchRows)
	}
	prev := 0.0
	for _, h := range []int{10, 100, 1000, 10000} {
		fp, union := SketchFalsePositive(h)
		if fp <= prev || fp >= 1 || union < fp {
			t.Errorf("SketchFalsePositive(%d) = %g, %g: not increasing in (0, 1), or union below", h, fp, union)
		}
		prev = fp
	}
	// Measured: light groups among 1000 heavy ones, within 5 sigma of the bound.
	const heavy, light, budget = 1000, 20000, 10
	s := NewSketch(randomSeeds(rand.New(rand.NewPCG(7, 8))))
	for h := range heavy {
		g := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(h >> 8), byte(h), 1}), 32)
		for range budget + 1 {
			s.Add(g, 1)
		}
	}
	misjudged := 0
	for l := range light {
		g := netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(l>>16), byte(l >> 8), byte(l)}), 32)
		if s.Add(g, 1) > budget {
			misjudged++
		}
	}
	_, p := SketchFalsePositive(heavy)
	if bound := light*p + 5*math.Sqrt(light*p*(1-p)) + 1; float64(misjudged) > bound {
		t.Errorf("%d of %d light groups misjudged among %d heavy; the bound allows %.1f", misjudged, light, heavy, bound)
	}
	t.Logf("%d heavy groups: %d of %d light groups misjudged; bound %.3g per group", heavy, misjudged, light, p)
}
