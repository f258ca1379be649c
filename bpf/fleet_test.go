package bpf_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	. "github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// fleetPolicyBPF is the default tiers, smooth, with a local max of 40000
// and a fleet of fleet.max fleetMax, over window: the table is compiled
// for fleetMax (tiers.Policy.TableMax).
func fleetPolicyBPF(t *testing.T, fleetMax uint64, window time.Duration) tiers.Policy {
	t.Helper()
	p := tiers.Default()
	p.Shape, p.Window = tiers.ShapeSmooth, window
	p.Fleet = &tiers.Fleet{Name: "t", Store: "redis://h", Max: fleetMax, Report: 100 * time.Millisecond, TTL: 3 * time.Second}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

// The fleet's others' in-budget sum X joins the program's R̂ of in-budget
// packets (docs/design.md §12), whatever their total: 300 packets per
// 300 ms window paced in real time on one CPU (without budgets, all in
// budget; own R̂ about 300 of fleet.max 1,000) are dropped at the model's
// q(own R̂ + X) within 5σ, the model on the program's clock reads; with X
// = 0 that is the plain smooth model (it drops next to none), with X =
// 10,000 nearly all; and Active's max is fleet.max. Before, each window
// was judged at full speed in an hour's window, which since issue 39's
// onset from the recent rate drops every packet whatever X.
func TestFleetOthersProgram(t *testing.T) {
	pinCPU(t, 0) // the onset is latched per CPU, the model's is one CPU's
	const (
		fleetMax = 1000
		perWin   = 300
		windows  = 4
		window   = 300 * time.Millisecond
	)
	p := fleetPolicyBPF(t, fleetMax, window)
	frame := UDP4(t, 514)
	var drops []float64
	for _, o := range [][2]uint64{{0, 0}, {500, 500}, {2000, 9000}, {10000, 10000}} {
		x, total := o[0], o[1]
		h := newHarness(t, p)
		if a, err := h.l.Active(); err != nil || a.Max != fleetMax {
			t.Fatalf("Active max %d, %v; want fleet.max %d", a.Max, err, fleetMax)
		}
		if err := h.l.SetFleetOthers(x, total); err != nil {
			t.Fatal(err)
		}
		if in, tot, err := h.l.FleetOthers(); err != nil || in != x || tot != total {
			t.Fatalf("FleetOthers %d, %d, %v; want %d, %d", in, tot, err, x, total)
		}
		h.expire()
		m := model.NewModel(p, h.tab, nil)
		m.SetTick(h.l.TickNs())
		if x != 0 {
			m.SetFleetOthers(x, total)
		}
		var want, variance float64
		dropped := 0
		n := fleetPaced(t, window, windows, perWin, func(_ int, now uint64) {
			if h.run(frame) != xdpPass {
				dropped++
			}
			m.Packet(now)
			_, thr := h.tab.Smooth(m.Estimate() + x)
			q := tiers.DropRatio(thr)
			want += q
			variance += q * (1 - q)
		})
		sigma := math.Sqrt(variance)
		t.Logf("others %d: dropped %d of %d, model %.1f ± %.1f", x, dropped, n, want, sigma)
		if math.Abs(float64(dropped)-want) > 5*sigma+1 {
			t.Errorf("others %d: dropped %d, want %.1f ± 5 × %.1f", x, dropped, want, sigma)
		}
		drops = append(drops, want/float64(n))
	}
	// The sums show: each larger X drops more, from next to none to most.
	for i := 1; i < len(drops); i++ {
		if drops[i] <= drops[i-1] {
			t.Errorf("the model's drop fractions %v: want each larger sum to drop more", drops)
		}
	}
	if drops[0] > 0.1 || drops[len(drops)-1] < 0.8 {
		t.Errorf("the model's drop fractions %v: want at most 0.1 with no sums, at least 0.8 with 10,000", drops)
	}
}

// FleetEstimate reads the program's own live R̂, the others left out: in
// the onset of a fresh hour's window after n ≥ 16 packets, the model's
// (EstimateAt: the estimator it judges with, E), and the
// ending window's count once it has expired; without budgets R̂_in and
// R̂_tot are equal. SetFleetOthers bounds each sum by
// tiers.MaxFleetOthers and the in-budget sum by the total, in either
// order of growth.
func TestFleetEstimateProgram(t *testing.T) {
	p := fleetPolicyBPF(t, 1000, time.Hour)
	h := newHarness(t, p)
	frame := UDP4(t, 514)
	if in, got, err := h.l.FleetEstimate(); err != nil || got != 0 || in != 0 {
		t.Fatalf("before any packet: FleetEstimate %d, %d, %v; want 0, 0", in, got, err)
	}
	for _, c := range []struct{ in, total, wantIn, wantTotal uint64 }{
		{1 << 50, 1 << 50, tiers.MaxFleetOthers, tiers.MaxFleetOthers},
		{5, 3, 3, 3},
		{700, 900, 700, 900},
		{100, 200, 100, 200},
	} {
		if err := h.l.SetFleetOthers(c.in, c.total); err != nil {
			t.Fatal(err)
		}
		if in, got, _ := h.l.FleetOthers(); in != c.wantIn || got != c.wantTotal {
			t.Errorf("SetFleetOthers(%d, %d) read back %d, %d, want %d, %d", c.in, c.total, in, got, c.wantIn, c.wantTotal)
		}
	}
	h.expire()
	const n = 100
	m := model.NewModel(p, h.tab, nil)
	m.SetTick(h.l.TickNs())
	for range n {
		m.Packet(monotonicNow(t))
		h.run(frame)
	}
	before := monotonicNow(t)
	in, got, err := h.l.FleetEstimate()
	after := monotonicNow(t)
	if err != nil {
		t.Fatal(err)
	}
	// The estimator it judges with (issue 39): latched, E of the
	// packets since the latch from the clock, which falls as the clock
	// runs on with no packet; the model's at the clock reads either side.
	_, hi := m.EstimateAt(before)
	_, lo := m.EstimateAt(after)
	if float64(got) < 0.9*float64(lo) || float64(got) > 1.1*float64(hi) || in != got || !m.Latched() {
		t.Errorf("onset: FleetEstimate %d, %d, want the model's EstimateAt between %d and %d (within 10 %%), twice (all in budget), latched (%v)", in, got, lo, hi, m.Latched())
	}
	h.expire()
	if in, got, _ := h.l.FleetEstimate(); got+1 < n || got > n || in != got {
		t.Errorf("expired: FleetEstimate %d, %d, want the ending window's %d (less a tick's share) twice", in, got, n)
	}
}

// Three programs, one fleet: members fed 60/30/10 of 3 × fleet.max per
// window in real time, each reporting FleetEstimate and taking the
// others' sum every report as the agent's loop does (without a store),
// pass P(R_fleet) together from the third window on, each the same
// fraction of its offered load, and each what the fleet model passes of
// the same rates, within 5σ plus the pacing's 10 % (as TestSmoothProgram).
func TestFleetProgramsSharing(t *testing.T) {
	const (
		fleetMax = 300
		window   = 500 * time.Millisecond
		report   = 50 * time.Millisecond
		windows  = 6
	)
	p := fleetPolicyBPF(t, fleetMax, window)
	R := 3.0 * fleetMax
	rates := []float64{0.6 * R, 0.3 * R, 0.1 * R}
	frame := UDP4(t, 514)
	hs := make([]*harness, len(rates))
	for i := range hs {
		hs[i] = newHarness(t, p)
	}
	tab := hs[0].tab
	streams := make([]budgetStream, len(rates))
	frames := make([][][]byte, len(rates))
	for i, r := range rates {
		streams[i], frames[i] = budgetStream{member: i, rate: r}, [][]byte{frame}
	}
	offered, passed, _ := fleetRealTime(t, hs, streams, frames, window, report, windows, func(i int, in, est uint64) {
		if in != est {
			t.Fatalf("member %d reports %d in budget of %d without budgets", i, in, est)
		}
	})
	// The pacing on a shared machine offers less than R at times: each
	// window is judged against P of what it was offered, and each member
	// against the fleet's fraction over the same windows.
	memOff, memPass := make([]int, len(rates)), make([]int, len(rates))
	var fleetOff, fleetPass float64
	for k := 2; k < windows; k++ {
		off, pass := 0, 0
		for i := range rates {
			off += offered[i][k]
			pass += passed[i][k]
			memOff[i] += offered[i][k]
			memPass[i] += passed[i][k]
		}
		want := tab.Expected(uint64(off)).Passed
		fl := want / float64(off)
		fleetOff, fleetPass = fleetOff+float64(off), fleetPass+want
		sigma := math.Sqrt(float64(off) * fl * (1 - fl))
		t.Logf("window %d: offered %d, passed %d, want P %.0f ± 5 × %.1f", k, off, pass, want, sigma)
		if math.Abs(float64(pass)-want) > 5*sigma+0.1*want {
			t.Errorf("window %d: the fleet passed %d of %d, want %.0f ± (5 × %.1f + 10%%)", k, pass, off, want, sigma)
		}
	}
	frac := fleetPass / fleetOff
	// The fleet model, on the same rates, evenly spaced.
	f := model.NewFleetModel(p, tab, len(rates), report, rand.New(rand.NewPCG(34, 12)).Uint32)
	modelPass := make([]int, len(rates))
	next := []float64{0, 0, 0}
	W := float64(window)
	for {
		i := 0
		for j := range next {
			if next[j] < next[i] {
				i = j
			}
		}
		if next[i] >= windows*W {
			break
		}
		if d := f.Packet(i, uint64(next[i])); d.Verdict == tiers.VerdictPass && next[i] >= 2*W {
			modelPass[i]++
		}
		next[i] += W / rates[i]
	}
	for i := range rates {
		got := float64(memPass[i]) / float64(memOff[i])
		sigma := math.Sqrt(frac * (1 - frac) / float64(memOff[i]))
		t.Logf("member %d: passed %d of %d (%.3f); the fleet model passes %d of %.0f", i, memPass[i], memOff[i], got, modelPass[i], rates[i]*(windows-2))
		if math.Abs(got-frac) > 5*sigma+0.1*frac {
			t.Errorf("member %d: passed %.3f of its offered, want %.3f ± (5 × %.3f + 10%%)", i, got, frac, sigma)
		}
		if mp := float64(modelPass[i]); math.Abs(float64(memPass[i])-mp) > 5*math.Sqrt(mp)+0.1*mp {
			t.Errorf("member %d: passed %d, the fleet model %d", i, memPass[i], modelPass[i])
		}
	}
}

// With max: auto (docs/design.md §12) a member passes no more than its
// learnt max allows on its own R̂: the agent folds the local bound into the
// others' sum it writes (tiers.FleetOthersWithAuto) at each report. A
// member offered 1000 per window whose collector takes a learnt max of 300
// passes the local P(1000), where the fleet alone (fleet.max 3000, others
// 500) would pass all of it; within 5σ plus the pacing's 10 %.
func TestFleetAutoProgram(t *testing.T) {
	const (
		window  = 500 * time.Millisecond
		report  = 50 * time.Millisecond
		windows = 5
		rate    = 1000.0
		others  = 500
	)
	p := fleetPolicyBPF(t, 3000, window)
	p.Auto = &tiers.AutoMax{Start: 300, Floor: 100, Ceiling: 1000}
	p.Max = 300
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, p)
	local := mustCompile(t, p.Local())
	frame := UDP4(t, 514)
	passed := make([]int, windows)
	offered := make([]int, windows)
	var sent float64
	start := time.Now()
	nextReport := time.Duration(0)
	for el := time.Since(start); el < windows*window; el = time.Since(start) {
		if el >= nextReport {
			nextReport += report
			in, own, err := h.l.FleetEstimate()
			if err != nil {
				t.Fatal(err)
			}
			if err := h.l.SetFleetOthers(tiers.FleetOthersWithAuto(h.tab, local, in, own, others, others)); err != nil {
				t.Fatal(err)
			}
		}
		k := int(el / window)
		for due := rate * float64(el) / float64(window); sent < due; sent++ {
			offered[k]++
			if h.run(frame) == xdpPass {
				passed[k]++
			}
		}
		time.Sleep(time.Millisecond - time.Since(start)%time.Millisecond)
	}
	fleetOnly := float64(rate) * h.tab.Expected(rate+others).Passed / (rate + others)
	for k := 2; k < windows; k++ {
		want := local.Expected(uint64(offered[k])).Passed
		sigma := math.Sqrt(want * (1 - want/float64(offered[k])))
		t.Logf("window %d: offered %d, passed %d; local P %.0f, the fleet alone %.0f", k, offered[k], passed[k], want, fleetOnly)
		if math.Abs(float64(passed[k])-want) > 5*sigma+0.1*want {
			t.Errorf("window %d: passed %d, want the local P %.0f ± (5 × %.1f + 10%%)", k, passed[k], want, sigma)
		}
	}
}
