package bpf_test

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// Per-source budgets in a fleet (docs/design.md §12, §6): the others'
// in-budget sum X joins R̂_in and their total Y R̂_tot. Windows of 300
// packets, each judged in the first ticks of an hour's window (R̂
// deterministic: the onset's 32 n from about the 20th packet on), a third
// from ten light groups, the rest from one noisy group over its budget of
// 20 after its 20th: the program drops the in-budget and the over-budget
// packets in the numbers the model (tiers.Model with SetFleetOthers, the
// program's sketch seeds) drops them, within 5σ of the model's spread over
// 100 runs, for (X, Y) = (0, 0) (no fleet), (4,000, 4,000), (4,000,
// 8,000) and (8,000, 8,000) with fleet.max 10,000; and the member reports
// (FleetEstimate) R̂_in of its in-budget packets and R̂_tot of all of
// them, as the model's EstimateAt. Without the sums in the over-budget
// packets' R̂ the program dropped 84 of the 3,600 over-budget packets at
// X = 8,000, as at X = 0, where the model drops 3,250.
func TestFleetBudgetsProgram(t *testing.T) {
	const (
		fleetMax = 10000
		perWin   = 300
		windows  = 20
		runs     = 100
	)
	p := fleetPolicyBPF(t, fleetMax, time.Hour)
	p.Sources = tiers.Sources{BudgetPackets: 20, PrefixV4: 32, PrefixV6: 64}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	var light [][]byte
	for i := range 10 {
		light = append(light, udpFrom(t, netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})))
	}
	noisy := udpFrom(t, netip.MustParseAddr("192.0.2.7"))
	lightSrc := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i/3%10 + 1)}) }
	noisySrc := netip.MustParseAddr("192.0.2.7")
	for _, o := range [][2]uint64{{0, 0}, {4000, 4000}, {4000, 8000}, {8000, 8000}} {
		x, y := o[0], o[1]
		h := newHarness(t, p)
		if err := h.l.SetFleetOthers(x, y); err != nil {
			t.Fatal(err)
		}
		// The program: drops of in-budget and over-budget packets.
		var gotIn, gotEx int
		for range windows {
			h.expire()
			for i := range perWin {
				if i%3 == 0 {
					if h.run(light[i/3%10]) != xdpPass {
						gotIn++
					}
				} else if h.run(noisy) != xdpPass {
					gotEx++ // its first 20 a window are in budget: sorted below
				}
			}
		}
		// What the member reports: R̂_in of its in-budget packets (the
		// light groups' 100 and the noisy group's first 20) and R̂_tot of
		// all its selected packets, over budget included (32 n each in
		// the onset).
		const nIn = perWin/3 + 20
		if in, got, err := h.l.FleetEstimate(); err != nil || got != 32*perWin || in != 32*nIn {
			t.Errorf("others %v: FleetEstimate %d, %d, %v; want %d (32 × the window's %d in budget), %d (32 × its %d packets)", o, in, got, err, 32*nIn, nIn, 32*perWin, perWin)
		}
		st := h.stats()
		over := st.OverBudget[tiers.VerdictPass].Packets + st.OverBudget[tiers.VerdictDrop].Packets
		if want := uint64(windows * (perWin*2/3 - 20)); over != want {
			t.Fatalf("others %v: %d over budget, want %d", o, over, want)
		}
		exDrops := int(st.OverBudget[tiers.VerdictDrop].Packets)
		gotIn += gotEx - exDrops // the noisy group's in-budget drops
		gotEx = exDrops
		// The model, runs times over the same sequence.
		var sumIn, sumEx, sqIn, sqEx float64
		for r := range uint64(runs) {
			m := tiers.NewModel(p, h.tab, rand.New(rand.NewPCG(r, x+y)).Uint32)
			m.SetTick(h.l.TickNs())
			m.SetSketchSeeds(h.l.SketchSeeds())
			m.SetFleetOthers(x, y)
			var in, ex float64
			for k := range uint64(windows) {
				now := k * uint64(time.Hour+time.Millisecond)
				for i := range perWin {
					src := noisySrc
					if i%3 == 0 {
						src = lightSrc(i)
					}
					d := m.PacketFrom(now, src)
					if d.Verdict == tiers.VerdictPass {
						continue
					}
					if d.OverBudget {
						ex++
					} else {
						in++
					}
				}
			}
			if in, got := m.EstimateAt(uint64(windows-1) * uint64(time.Hour+time.Millisecond)); got != 32*perWin || in != 32*nIn {
				t.Fatalf("others %v: the model's EstimateAt %d, %d, want %d, %d", o, in, got, 32*nIn, 32*perWin)
			}
			sumIn, sumEx, sqIn, sqEx = sumIn+in, sumEx+ex, sqIn+in*in, sqEx+ex*ex
		}
		meanIn, meanEx := sumIn/runs, sumEx/runs
		sdIn := math.Sqrt(max(sqIn/runs-meanIn*meanIn, 0))
		sdEx := math.Sqrt(max(sqEx/runs-meanEx*meanEx, 0))
		t.Logf("others %v: in budget dropped %d of %d (model %.1f ± %.1f), over budget dropped %d of %d (model %.1f ± %.1f)",
			o, gotIn, windows*(perWin/3+20), meanIn, sdIn, gotEx, over, meanEx, sdEx)
		if math.Abs(float64(gotIn)-meanIn) > 5*sdIn+1 {
			t.Errorf("others %v: in-budget drops %d, want %.1f ± 5 × %.1f", o, gotIn, meanIn, sdIn)
		}
		if math.Abs(float64(gotEx)-meanEx) > 5*sdEx+1 {
			t.Errorf("others %v: over-budget drops %d, want %.1f ± 5 × %.1f", o, gotEx, meanEx, sdEx)
		}
	}
}
