package tiers

import (
	"math"
	"reflect"
	"testing"
	"time"
)

// mustCompile compiles p and checks the Table invariants.
func mustCompile(t *testing.T, p Policy) Table {
	t.Helper()
	tab, err := Compile(p, 0)
	if err != nil {
		t.Fatalf("Compile(%v): %v", p, err)
	}
	if err := checkTable(p, tab); err != "" {
		t.Fatalf("Compile(%v): %s", p, err)
	}
	return tab
}

// checkTable returns what is wrong with a compiled table, or "".
func checkTable(p Policy, tab Table) string {
	K := len(p.Tiers)
	n := tab.Len()
	switch {
	case n == 0 || n > MaxTableEntries:
		return "length out of range"
	case len(tab.Tiers) != n:
		return "Tiers and Thresholds differ in length"
	case len(tab.Bounds) != K || len(tab.Drops) != K+1 || tab.Drops[0] != 0:
		return "Bounds or Drops of the wrong length, or Drops[0] != 0"
	case tab.Shift == 0 && uint64(n) != tab.Bounds[K-1]+1:
		return "unshifted length is not T_last + 1"
	case tab.Shift > 0 && tableLen(tab.Bounds[K-1], tab.Shift-1) <= MaxTableEntries:
		return "Shift is not the smallest"
	case int(tab.Tiers[n-1]) != K:
		return "last entry is not in the last tier"
	case tab.MaxRoundingError > (1<<tab.Shift)-1:
		return "MaxRoundingError over the step"
	}
	for i := range n {
		if i > 0 && tab.Tiers[i] < tab.Tiers[i-1] {
			return "tiers not monotone"
		}
		if tab.Thresholds[i] != tab.Drops[tab.Tiers[i]] {
			return "threshold is not its tier's"
		}
	}
	for k, b := range tab.Bounds {
		if k > 0 && b < tab.Bounds[k-1] {
			return "bounds not monotone"
		}
		start := tab.TierStart(k + 1)
		if start < b || start-b > tab.MaxRoundingError {
			return "tier start moved by more than MaxRoundingError"
		}
		// The packet at the tier start is in tier k+1 or above, the one
		// before it below.
		if tier, _ := tab.Lookup(start); tier < k+1 {
			return "Lookup(TierStart(k)) below tier k"
		}
		if start > 0 {
			if tier, _ := tab.Lookup(start - 1); tier > k {
				return "Lookup(TierStart(k)-1) in tier k"
			}
		}
	}
	return ""
}

func TestDefaultTable(t *testing.T) {
	p := Default()
	tab := mustCompile(t, p)
	if want := []uint64{28000, 32000, 40000}; !reflect.DeepEqual(tab.Bounds, want) {
		t.Errorf("Bounds = %v, want %v", tab.Bounds, want)
	}
	if want := []uint32{0, 858993459, 1 << 31, AlwaysDrop}; !reflect.DeepEqual(tab.Drops, want) {
		t.Errorf("Drops = %v, want %v", tab.Drops, want)
	}
	if tab.Len() != 40001 || tab.Shift != 0 || tab.MaxRoundingError != 0 {
		t.Errorf("Len, Shift, MaxRoundingError = %d, %d, %d; want 40001, 0, 0", tab.Len(), tab.Shift, tab.MaxRoundingError)
	}
	for _, c := range []struct {
		n    uint64
		tier int
	}{
		{1, 0}, {27999, 0}, {28000, 1}, {31999, 1}, {32000, 2}, {39999, 2},
		{40000, 3}, {40001, 3}, {1e9, 3}, {math.MaxUint64, 3},
	} {
		tier, thr := tab.Lookup(c.n)
		if tier != c.tier || thr != tab.Drops[c.tier] {
			t.Errorf("Lookup(%d) = %d, %#x; want %d, %#x", c.n, tier, thr, c.tier, tab.Drops[c.tier])
		}
		if got := p.TierOf(c.n); got != c.tier {
			t.Errorf("TierOf(%d) = %d, want %d", c.n, got, c.tier)
		}
	}
}

func TestExpectedDefault(t *testing.T) {
	e, err := Expected(Default(), 100000)
	if err != nil {
		t.Fatal(err)
	}
	// 27999 in tier 0, 4000 in tier 1 at 20%, 8000 in tier 2 at 50%, the
	// rest dropped. 20% is 858993459 / 2^32 on the BPF scale, 2^-33 below
	// 0.2 at most, so the sum is 35199 within 4000 × 2^-33.
	if math.Abs(e.Passed-35199) > 1e-6 {
		t.Errorf("Passed = %v, want 35199", e.Passed)
	}
	if math.Abs(e.Passed+e.Dropped-100000) > 1e-6 {
		t.Errorf("Passed + Dropped = %v, want 100000", e.Passed+e.Dropped)
	}
	want := []struct{ first, last, packets uint64 }{
		{1, 27999, 27999}, {28000, 31999, 4000}, {32000, 39999, 8000}, {40000, 100000, 60001},
	}
	for k, w := range want {
		te := e.PerTier[k]
		if te.Tier != k || te.First != w.first || te.Last != w.last || te.Packets != w.packets {
			t.Errorf("PerTier[%d] = %+v, want range [%d, %d], %d packets", k, te, w.first, w.last, w.packets)
		}
	}
	if e.PerTier[2].DropRatio != 0.5 || e.PerTier[3].DropRatio != 1 || e.PerTier[0].DropRatio != 0 {
		t.Errorf("DropRatios = %v, %v, %v; want 0, 0.5, 1", e.PerTier[0].DropRatio, e.PerTier[2].DropRatio, e.PerTier[3].DropRatio)
	}
	// Only tiers 1 and 2 are random: 4000×0.2×0.8 + 8000×0.25 = 2640.
	if math.Abs(e.Variance-2640) > 1e-3 {
		t.Errorf("Variance = %v, want 2640", e.Variance)
	}

	// Below T_1 everything passes; with nothing offered nothing happens.
	for _, c := range []struct {
		offered uint64
		passed  float64
	}{{0, 0}, {1, 1}, {27999, 27999}} {
		e, _ := Expected(Default(), c.offered)
		if e.Passed != c.passed || e.Dropped != 0 || e.Variance != 0 {
			t.Errorf("Expected(%d) = %+v, want %v passed, none dropped", c.offered, e, c.passed)
		}
	}
}

// policyWith returns the default policy with other max and tiers.
func policyWith(max uint64, tiers ...Tier) Policy {
	p := Default()
	p.Max = max
	p.Tiers = tiers
	return p
}

// The seed filled [T_i, T_i+1) for all but the last tier, then [max, 150000)
// with the last rate: with the last tier at 90% it left [36000, 40000)
// unfilled, and at 120% it overwrote [40000, 48000) of the tier before.
func TestLastTierNotAt100(t *testing.T) {
	for _, last := range []int64{90, 120} {
		p := policyWith(40000, Tier{Pct(70), Pct(20)}, Tier{Pct(80), Pct(50)}, Tier{Pct(last), Pct(100)})
		tab := mustCompile(t, p)
		T := []uint64{28000, 32000, uint64(400 * last)}
		if !reflect.DeepEqual(tab.Bounds, T) {
			t.Fatalf("last %v%%: Bounds = %v, want %v", last, tab.Bounds, T)
		}
		if tab.Len() != int(T[2])+1 {
			t.Errorf("last %v%%: Len = %d, want %d", last, tab.Len(), T[2]+1)
		}
		// Every entry is the exact tier of its n: contiguous ranges that
		// start exactly at T_k, no gap, no overwrite.
		for i := range tab.Len() {
			if want := p.TierOf(uint64(i)); int(tab.Tiers[i]) != want || tab.Thresholds[i] != tab.Drops[want] {
				t.Fatalf("last %v%%: entry %d = tier %d, thr %#x; want tier %d", last, i, tab.Tiers[i], tab.Thresholds[i], want)
			}
		}
		for k, b := range T {
			if tier, _ := tab.Lookup(b); tier != k+1 {
				t.Errorf("last %v%%: Lookup(T_%d = %d) = tier %d", last, k+1, b, tier)
			}
			if tier, _ := tab.Lookup(b - 1); tier != k {
				t.Errorf("last %v%%: Lookup(T_%d - 1) = tier %d, want %d", last, k+1, tier, k)
			}
		}
		for _, n := range []uint64{T[2], 40000, 48000, 150000, 1e9} {
			if tier, thr := tab.Lookup(n); n >= T[2] && (tier != 3 || thr != AlwaysDrop) {
				t.Errorf("last %v%%: Lookup(%d) = %d, %#x; want the last tier", last, n, tier, thr)
			}
		}
	}
}

func TestThresholdRounding(t *testing.T) {
	for _, c := range []struct {
		max uint64
		at  string
		T   uint64
	}{
		{3, "50", 1},          // 1.5
		{40001, "70", 28000},  // 28000.7
		{40000, "70", 28000},  // exactly, not 27999.999…
		{100, "29", 29},       // 100 × 0.29 is 28.999… in float64
		{1000, "33.3", 333},   // 1000 × 33.3 / 100 is 332.999… in float64
		{40000, "12.5", 5000}, // a decimal percent
		{7, "0.000001", 0},    // floor to 0: tier 1 starts at n = 0
		{1 << 40, "100000", 1 << 40 * 1000},
	} {
		p := policyWith(c.max, Tier{At: MustParsePercent(c.at), Drop: Pct(50)})
		tab := mustCompile(t, p)
		if tab.Bounds[0] != c.T {
			t.Errorf("max %d, at %v%%: T = %d, want %d", c.max, c.at, tab.Bounds[0], c.T)
		}
	}
}

// Two tiers whose thresholds floor to the same packet leave the first empty.
func TestMergedThresholds(t *testing.T) {
	p := policyWith(3, Tier{Pct(50), Pct(10)}, Tier{Pct(60), Pct(20)}, Tier{Pct(100), Pct(100)})
	tab := mustCompile(t, p)
	if want := []uint64{1, 1, 3}; !reflect.DeepEqual(tab.Bounds, want) {
		t.Fatalf("Bounds = %v, want %v", tab.Bounds, want)
	}
	if want := []uint8{0, 2, 2, 3}; !reflect.DeepEqual(tab.Tiers, want) {
		t.Errorf("Tiers = %v, want %v", tab.Tiers, want)
	}
	e := tab.Expected(10)
	if got := e.PerTier[1]; got.Packets != 0 || got.First != 0 || got.Last != 0 {
		t.Errorf("empty tier 1 = %+v", got)
	}
	if e.PerTier[0].Packets != 0 || e.PerTier[2].Packets != 2 || e.PerTier[3].Packets != 8 {
		t.Errorf("PerTier = %+v", e.PerTier)
	}
}

func TestLargeTable(t *testing.T) {
	for _, max := range []uint64{1e8, 1e8 + 1, 1<<20 - 1, 1 << 20, 1<<20 + 1} {
		p := policyWith(max, Tier{Pct(70), Pct(20)}, Tier{Pct(80), Pct(50)}, Tier{Pct(100), Pct(100)})
		tab := mustCompile(t, p)
		step := uint64(1) << tab.Shift
		T := tab.Bounds
		if T[2] != max {
			t.Fatalf("max %d: T_3 = %d", max, T[2])
		}
		if max >= MaxTableEntries && tab.Shift == 0 {
			t.Errorf("max %d: Shift = 0, Len = %d", max, tab.Len())
		}
		for k := range T {
			if want := (T[k] + step - 1) / step * step; tab.TierStart(k+1) != want {
				t.Errorf("max %d: TierStart(%d) = %d, want %d", max, k+1, tab.TierStart(k+1), want)
			}
		}
		// The table never drops early, and never later than the step.
		for _, n := range []uint64{1, T[0] - 1, T[0], T[0] + step - 1, T[1], T[2] - 1, T[2], T[2] + 1, 10 * max} {
			tier, _ := tab.Lookup(n)
			exact := p.TierOf(n)
			rounded := p.TierOf(n - min(n, tab.MaxRoundingError))
			if tier > exact || tier < rounded {
				t.Errorf("max %d: Lookup(%d) = tier %d, exact %d, %d packets earlier %d", max, n, tier, exact, tab.MaxRoundingError, rounded)
			}
		}
		// Past the last threshold every packet is in the last tier, even
		// when T_last is not a multiple of the step.
		if tier, thr := tab.Lookup(T[2] + step); tier != 3 || thr != AlwaysDrop {
			t.Errorf("max %d: Lookup(T_3 + step) = %d, %#x", max, tier, thr)
		}
	}

	tab := mustCompile(t, policyWith(1e8, Tier{Pct(70), Pct(20)}, Tier{Pct(80), Pct(50)}, Tier{Pct(100), Pct(100)}))
	// 10^8 / 2^7 = 781250 entries fit in 2^20; 2^6 does not.
	if tab.Shift != 7 || tab.Len() != 781251 {
		t.Errorf("max 1e8: Shift %d, Len %d; want 7, 781251", tab.Shift, tab.Len())
	}
	// 7×10^7, 8×10^7, 10^8 are multiples of 128: no rounding.
	if tab.MaxRoundingError != 0 {
		t.Errorf("max 1e8: MaxRoundingError = %d, want 0", tab.MaxRoundingError)
	}
	tab = mustCompile(t, policyWith(1e8+1, Tier{Pct(70), Pct(20)}, Tier{Pct(80), Pct(50)}, Tier{Pct(100), Pct(100)}))
	// 70000000.7 → 70000000 (aligned), 80000000 (aligned), 100000001 (127
	// short of the next multiple of 128).
	if tab.MaxRoundingError != 127 {
		t.Errorf("max 1e8+1: MaxRoundingError = %d, want 127", tab.MaxRoundingError)
	}
}

func TestDropThreshold(t *testing.T) {
	for _, c := range []struct {
		micro int64
		thr   uint32
	}{
		{0, 0},
		{1, 43}, // 10^-6 % of 2^32 is 42.9
		{20 * microPerPercent, 858993459},
		{50 * microPerPercent, 1 << 31},
		{microHundred - 1, 4294967253},
		{microHundred, AlwaysDrop},
	} {
		if got := dropThreshold(c.micro); got != c.thr {
			t.Errorf("dropThreshold(%d) = %d, want %d", c.micro, got, c.thr)
		}
	}
}

func TestDropped(t *testing.T) {
	for _, c := range []struct {
		thr, rnd uint32
		want     bool
	}{
		{0, 0, false}, {0, math.MaxUint32, false},
		{1, 0, true}, {1, 1, false},
		{1 << 31, 1<<31 - 1, true}, {1 << 31, 1 << 31, false},
		{AlwaysDrop - 1, AlwaysDrop - 1, false},
		{AlwaysDrop, 0, true}, {AlwaysDrop, math.MaxUint32, true},
	} {
		if got := Dropped(c.thr, c.rnd); got != c.want {
			t.Errorf("Dropped(%#x, %#x) = %v, want %v", c.thr, c.rnd, got, c.want)
		}
	}
}

// The values themselves are the BPF program's (enum tl_verdict): bpf's
// TestContract compares them with C.
func TestVerdictStrings(t *testing.T) {
	for v, s := range map[Verdict]string{VerdictPass: "pass", VerdictDrop: "drop", VerdictWouldDrop: "would_drop", 3: "Verdict(3)"} {
		if v.String() != s {
			t.Errorf("%d.String() = %q, want %q", v, v.String(), s)
		}
	}
}

func TestZeroTable(t *testing.T) {
	var tab Table
	if tier, thr := tab.Lookup(5); tier != 0 || thr != 0 {
		t.Errorf("zero Table Lookup = %d, %d", tier, thr)
	}
}

func TestCompileInvalid(t *testing.T) {
	p := Default()
	p.Window = 2 * time.Hour
	if _, err := Compile(p, 0); err == nil {
		t.Error("Compile of an invalid policy succeeded")
	}
}
