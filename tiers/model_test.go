package tiers

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestModelWindowRule(t *testing.T) {
	p := Default()
	p.Window = time.Second
	tab := mustCompile(t, p)
	m := NewModel(p, tab, func() uint32 { return 0 })
	const w = uint64(time.Second)

	steps := []struct {
		now    uint64
		n      uint64
		opened bool
	}{
		{0, 1, true}, // the first packet ever opens a window, even at 0
		{1, 2, false},
		{w, 3, false},       // exactly start + window: same window
		{w + 1, 1, true},    // start + window + 1: a new one, anchored at w+1
		{2*w + 1, 2, false}, // exactly the new start + window
		{2*w + 2, 1, true},
		{2*w + 1, 2, false}, // a clock before the start stays in the window
		{10 * w, 1, true},   // after a quiet spell: traffic, not the wall clock, anchors
		{10*w + w/2, 2, false},
	}
	for i, s := range steps {
		d := m.Packet(s.now)
		if d.N != s.n || d.WindowOpened != s.opened || m.N() != s.n {
			t.Errorf("step %d: Packet(%d) = N %d opened %v (N() %d); want N %d opened %v", i, s.now, d.N, d.WindowOpened, m.N(), s.n, s.opened)
		}
	}

	// SetWindow puts the model mid-window.
	m.SetWindow(100*w, 27998)
	if d := m.Packet(100 * w); d.N != 27999 || d.Tier != 0 || d.WindowOpened {
		t.Errorf("after SetWindow: %+v, want N 27999 in tier 0", d)
	}
	if d := m.Packet(101 * w); d.N != 28000 || d.Tier != 1 {
		t.Errorf("after SetWindow: %+v, want N 28000 in tier 1", d)
	}
}

func TestModelCountsDropped(t *testing.T) {
	// Every packet from n = 1 on is in a tier that drops all.
	p := Default()
	p.Max = 10
	p.Tiers = []Tier{{Pct(10), Pct(100)}}
	tab := mustCompile(t, p)
	m := NewModel(p, tab, func() uint32 { t.Fatal("rand drawn for drop 100%"); return 0 })
	for i := uint64(1); i <= 20; i++ {
		d := m.Packet(i)
		if d.N != i || d.Tier != 1 || d.Verdict != VerdictDrop {
			t.Fatalf("packet %d: %+v, want N %d, tier 1, dropped", i, d, i)
		}
	}
}

func TestModelModes(t *testing.T) {
	p := Default()
	p.Shape = ShapeOrdinal
	p.Max = 100
	p.Tiers = []Tier{{Pct(10), Pct(0)}, {Pct(20), Pct(50)}, {Pct(30), Pct(100)}} // T = 10, 20, 30
	tab := mustCompile(t, p)
	type want struct {
		n       uint64
		rnd     uint32 // the draw, if drawn
		drawn   bool
		verdict [3]Verdict // enforce, dry-run, off
	}
	P, D, W := VerdictPass, VerdictDrop, VerdictWouldDrop
	cases := []want{
		{1, 0, false, [3]Verdict{P, P, P}},               // tier 0
		{10, 0, false, [3]Verdict{P, P, P}},              // tier 1, drop 0%: no draw
		{20, 1<<31 - 1, true, [3]Verdict{D, W, P}},       // tier 2, drawn below 2^31
		{21, 1 << 31, true, [3]Verdict{P, P, P}},         // drawn at 2^31: spared
		{30, math.MaxUint32, false, [3]Verdict{D, W, P}}, // tier 3, drop 100%: no draw
	}
	for mi, mode := range []Mode{ModeEnforce, ModeDryRun, ModeOff} {
		p.Mode = mode
		for _, c := range cases {
			draws := 0
			m := NewModel(p, tab, func() uint32 { draws++; return c.rnd })
			m.SetWindow(0, c.n-1)
			d := m.Packet(1)
			wantDraws := 0
			if c.drawn && mode != ModeOff {
				wantDraws = 1
			}
			if d.N != c.n || d.Verdict != c.verdict[mi] || draws != wantDraws {
				t.Errorf("%s, n %d, rnd %#x: %+v with %d draws; want %s with %d", mode, c.n, c.rnd, d, draws, c.verdict[mi], wantDraws)
			}
			if d.Tier != p.TierOf(c.n) {
				t.Errorf("%s, n %d: tier %d, want %d", mode, c.n, d.Tier, p.TierOf(c.n))
			}
		}
	}
}

// The model, driven with 10^6 packets at 2.5 × max, passes what Expected
// says within 5 sigma, and puts exactly the expected packets in each tier.
func TestModelAgreesWithExpected(t *testing.T) {
	for _, c := range []struct {
		name   string
		mode   Mode
		counts Verdict // the verdict Expected's Dropped stands for
	}{{"enforce", ModeEnforce, VerdictDrop}, {"dry-run", ModeDryRun, VerdictWouldDrop}} {
		t.Run(c.name, func(t *testing.T) {
			p := Default()
			p.Shape = ShapeOrdinal
			p.Mode = c.mode
			p.Max = 1000
			p.Tiers = []Tier{{Pct(50), Pct(10)}, {Pct(70), Pct(20)}, {Pct(80), Pct(50)}, {Pct(100), Pct(90)}, {Pct(150), Pct(100)}}
			const windows, perWindow = 400, 2500
			tab := mustCompile(t, p)
			e, err := Expected(p, perWindow)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			m := NewModel(p, tab, rng.Uint32)

			var passed, dropped float64
			perTier := make([]uint64, len(p.Tiers)+1)
			window := uint64(p.Window)
			for w := range uint64(windows) {
				// 2500 packets 1 µs apart, then a gap of more than a window.
				start := w * 3 * window
				for i := range uint64(perWindow) {
					d := m.Packet(start + i*1000)
					if d.WindowOpened != (i == 0) || d.N != i+1 {
						t.Fatalf("window %d packet %d: %+v", w, i, d)
					}
					perTier[d.Tier]++
					switch d.Verdict {
					case VerdictPass:
						passed++
					case c.counts:
						dropped++
					default:
						t.Fatalf("verdict %s in mode %s", d.Verdict, c.mode)
					}
				}
			}
			for k, te := range e.PerTier {
				if perTier[k] != windows*te.Packets {
					t.Errorf("tier %d: %d packets, want %d", k, perTier[k], windows*te.Packets)
				}
			}
			if passed+dropped != windows*perWindow {
				t.Fatalf("passed + dropped = %v", passed+dropped)
			}
			mean := passed / windows
			sigma := math.Sqrt(e.Variance / windows)
			t.Logf("mean passed per window %.3f, expected %.3f, sigma of the mean %.3f", mean, e.Passed, sigma)
			if sigma == 0 || math.Abs(mean-e.Passed) > 5*sigma {
				t.Errorf("mean passed per window %.3f, expected %.3f ± 5 × %.3f", mean, e.Passed, sigma)
			}
		})
	}
}

func TestEmptyTiers(t *testing.T) {
	for _, c := range []struct {
		bounds []uint64
		want   []int
	}{
		{[]uint64{28000, 32000, 40000}, nil},
		{[]uint64{1, 1, 3}, []int{0, 1}},
		{[]uint64{0, 2, 2}, []int{0, 2}},
		{[]uint64{5, 5, 5}, []int{1, 2}},
	} {
		if got := EmptyTiers(Table{Bounds: c.bounds}); !slices.Equal(got, c.want) {
			t.Errorf("EmptyTiers(%v) = %v, want %v", c.bounds, got, c.want)
		}
	}
}
