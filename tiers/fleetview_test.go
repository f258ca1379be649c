package tiers

import (
	"math"
	"testing"
)

// The program's fallback judges the fleet's table at k·R̂ (bpf/fleet.h):
// it must pass what the fallback's own table passes at R̂, P_{M/k}(R) =
// P_M(k·R)/k, within the rounding of each tier's threshold to a packet.
func TestFleetFallbackMultTable(t *testing.T) {
	const fleetMax = 200000
	for _, fbMax := range []uint64{66666, 28571, 1000, 500000} {
		p := fleetPolicy(t, fleetMax, fbMax)
		fleetTab := mustCompile(t, p)
		alone := p.Local()
		aloneTab := mustCompile(t, alone)
		k := float64(FleetFallbackMult(fleetMax, fbMax)) / (1 << SmoothFracBits)
		worst := 0.0
		for r := uint64(1); r < 40*fbMax; r += max(fbMax/997, 1) {
			kr := uint64(math.Round(float64(r) * k))
			got := fleetTab.Pass(kr) / k
			want := aloneTab.Pass(r)
			worst = max(worst, math.Abs(got-want)/float64(fbMax))
		}
		// The thresholds of max fbMax and of fleetMax round to a packet
		// each (a few tiers), and k to 2^-16: well under 0.5 % of the max.
		if worst > 0.005 {
			t.Errorf("fallback max %d (k %.4f): P_M(kR)/k differs from P_{M/k}(R) by up to %.4f of the max", fbMax, k, worst)
		}
		t.Logf("fallback max %d, k %.4f: worst difference %.5f of the max", fbMax, k, worst)
	}
}

func TestFleetFallbackMult(t *testing.T) {
	for _, c := range []struct{ table, fb, want uint64 }{
		{200000, 200000, 1 << 16}, {200000, 66666, 196610}, {200000, 100000, 2 << 16}, {1000, 4000, 1 << 14},
		{1 << 40, 1, FleetMultMax}, {1, 1 << 40, 1}, {0, 5, 1 << 16}, {5, 0, 1 << 16},
	} {
		if got := FleetFallbackMult(c.table, c.fb); got != c.want {
			t.Errorf("FleetFallbackMult(%d, %d) = %d, want %d", c.table, c.fb, got, c.want)
		}
	}
}

// FleetAlone is the fallback the program reaches alone, from each state
// the agent can write it in.
func TestFleetAlone(t *testing.T) {
	p := fleetPolicy(t, 200000, 1000)
	one := uint64(1 << SmoothFracBits)
	for _, c := range []struct {
		name string
		fb   FleetFallback
		st   State
		want uint64
	}{
		{"share, joined, 3 seen", FallbackShare, State{Members: 3}, FleetFallbackMult(200000, 66666)},
		{"share, never seen: the local max", FallbackShare, State{}, 200 << 16},
		{"share, in fallback", FallbackShare, State{Fallback: true, Members: 3}, one},
		{"local, joined", FallbackLocal, State{Members: 3}, 200 << 16},
		{"local, in fallback", FallbackLocal, State{Fallback: true, Members: 3}, one},
		{"last, joined: alone it is share", FallbackLast, State{Members: 4, LastShare: 120000}, 4 << 16},
		{"last, holding its share: share's when it expires", FallbackLast, State{Fallback: true, Members: 4, LastShare: 100000}, 2 << 16},
		{"last, decayed", FallbackLast, State{Fallback: true, Members: 4}, one},
	} {
		q := p.Clone()
		q.Fleet.Fallback = c.fb
		if got := FleetAlone(q, c.st); got != c.want {
			t.Errorf("%s: FleetAlone = %d, want %d", c.name, got, c.want)
		}
	}
	if got := FleetAlone(p.Local(), State{}); got != one {
		t.Errorf("no fleet: %d, want %d", got, one)
	}
}

func TestFleetLastShare(t *testing.T) {
	for _, c := range []struct{ own, fleet, max, want uint64 }{
		{600, 1000, 200000, 120000}, {0, 1000, 200000, 1}, {1000, 1000, 200000, 200000}, {5, 0, 200000, 0},
		{2000, 1000, 200000, 200000}, {1 << 45, 1 << 46, 1 << 40, 1 << 39},
	} {
		if got := FleetLastShare(c.own, c.fleet, c.max); got != c.want {
			t.Errorf("FleetLastShare(%d, %d, %d) = %d, want %d", c.own, c.fleet, c.max, got, c.want)
		}
	}
}

// fallback: last applies the last share while it holds, then share's max.
func TestFleetFallbackLast(t *testing.T) {
	p := fleetPolicy(t, 200000, 1000)
	p.Fleet.Fallback = FallbackLast
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if q, _ := Effective(p, State{Fallback: true, Members: 3, LastShare: 120000}); q.Max != 120000 || q.Fleet != nil {
		t.Errorf("holding: max %d fleet %v, want 120000 and off", q.Max, q.Fleet)
	}
	if q, _ := Effective(p, State{Fallback: true, Members: 3}); q.Max != 66666 {
		t.Errorf("decayed: max %d, want share's 66666", q.Max)
	}
	if q, _ := Effective(p, State{Fallback: true}); q.Max != 1000 {
		t.Errorf("never seen: max %d, want the local 1000", q.Max)
	}
	y := []byte("max: 1000\nshape: smooth\nfleet:\n  name: f\n  store: redis://h\n  max: 5000\n  fallback: last\n")
	if q, err := ParseYAML(y); err != nil || q.Fleet.Fallback != FallbackLast {
		t.Errorf("fallback: last parsed as %v, %v", q.Fleet, err)
	}
	_, err := ParseYAML([]byte("max: 1000\nshape: smooth\nfleet:\n  name: f\n  store: redis://h\n  max: 5000\n  fallback: first\n"))
	checkConfigError(t, err, ErrFleet, "fleet.fallback", 7)
}

// The partition bounds of docs/design.md §12 for the default tiers (C_X
// = 0.88 X): share (1 + k/N) C_M, local C_M + k C_local, last (1 + Σ s) C_M.
func TestFleetPartitionBound(t *testing.T) {
	p := fleetPolicy(t, 600, 400)
	for _, c := range []struct {
		fb   FleetFallback
		cut  []float64
		want float64
	}{
		{FallbackShare, []float64{0.6}, 528 * 4 / 3.0},
		{FallbackShare, []float64{0.6, 0.3}, 528 * 5 / 3.0},
		{FallbackLocal, []float64{0.6}, 528 + 352},
		{FallbackLast, []float64{0.6}, 528 * 1.6},
		{FallbackLast, nil, 528},
	} {
		p.Fleet.Fallback = c.fb
		got, err := FleetPartitionBound(p, 3, c.cut, 1<<20)
		if err != nil || math.Abs(got-c.want) > 4 { // thresholds round to a packet at max 200
			t.Errorf("%s, cut %v: %.1f, %v; want %.1f", c.fb, c.cut, got, err, c.want)
		}
	}
}
