package model

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

func TestModelWindowRule(t *testing.T) {
	p := tiers.Default()
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
	p := tiers.Default()
	p.Max = 10
	p.Tiers = []tiers.Tier{{At: tiers.Pct(10), Drop: tiers.Pct(100)}}
	tab := mustCompile(t, p)
	m := NewModel(p, tab, func() uint32 { t.Fatal("rand drawn for drop 100%"); return 0 })
	for i := uint64(1); i <= 20; i++ {
		d := m.Packet(i)
		if d.N != i || d.Tier != 1 || d.Verdict != tiers.VerdictDrop {
			t.Fatalf("packet %d: %+v, want N %d, tier 1, dropped", i, d, i)
		}
	}
}

func TestModelModes(t *testing.T) {
	p := tiers.Default()
	p.Shape = tiers.ShapeOrdinal
	p.Max = 100
	p.Tiers = []tiers.Tier{{At: tiers.Pct(10), Drop: tiers.Pct(0)}, {At: tiers.Pct(20), Drop: tiers.Pct(50)}, {At: tiers.Pct(30), Drop: tiers.Pct(100)}} // T = 10, 20, 30
	tab := mustCompile(t, p)
	type want struct {
		n       uint64
		rnd     uint32 // the draw, if drawn
		drawn   bool
		verdict [3]tiers.Verdict // enforce, dry-run, off
	}
	P, D, W := tiers.VerdictPass, tiers.VerdictDrop, tiers.VerdictWouldDrop
	cases := []want{
		{1, 0, false, [3]tiers.Verdict{P, P, P}},               // tier 0
		{10, 0, false, [3]tiers.Verdict{P, P, P}},              // tier 1, drop 0%: no draw
		{20, 1<<31 - 1, true, [3]tiers.Verdict{D, W, P}},       // tier 2, drawn below 2^31
		{21, 1 << 31, true, [3]tiers.Verdict{P, P, P}},         // drawn at 2^31: spared
		{30, math.MaxUint32, false, [3]tiers.Verdict{D, W, P}}, // tier 3, drop 100%: no draw
	}
	for mi, mode := range []tiers.Mode{tiers.ModeEnforce, tiers.ModeDryRun, tiers.ModeOff} {
		p.Mode = mode
		for _, c := range cases {
			draws := 0
			m := NewModel(p, tab, func() uint32 { draws++; return c.rnd })
			m.SetWindow(0, c.n-1)
			d := m.Packet(1)
			wantDraws := 0
			if c.drawn && mode != tiers.ModeOff {
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
		mode   tiers.Mode
		counts tiers.Verdict // the verdict Expected's Dropped stands for
	}{{"enforce", tiers.ModeEnforce, tiers.VerdictDrop}, {"dry-run", tiers.ModeDryRun, tiers.VerdictWouldDrop}} {
		t.Run(c.name, func(t *testing.T) {
			p := tiers.Default()
			p.Shape = tiers.ShapeOrdinal
			p.Mode = c.mode
			p.Max = 1000
			p.Tiers = []tiers.Tier{{At: tiers.Pct(50), Drop: tiers.Pct(10)}, {At: tiers.Pct(70), Drop: tiers.Pct(20)}, {At: tiers.Pct(80), Drop: tiers.Pct(50)}, {At: tiers.Pct(100), Drop: tiers.Pct(90)}, {At: tiers.Pct(150), Drop: tiers.Pct(100)}}
			const windows, perWindow = 400, 2500
			tab := mustCompile(t, p)
			e, err := tiers.Expected(p, perWindow)
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
					case tiers.VerdictPass:
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

// mustCompile compiles p; tiers' own tests check the Table invariants.
func mustCompile(t *testing.T, p tiers.Policy) tiers.Table {
	t.Helper()
	tab, err := tiers.Compile(p, 0)
	if err != nil {
		t.Fatalf("Compile(%v): %v", p, err)
	}
	return tab
}
