package agent_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// fleetAutoPolicy is a fleet member's policy over a 500 ms window, with a
// fixed max or, with auto, max: auto starting at max.
func fleetAutoPolicy(t *testing.T, store string, max uint64, auto bool) tiers.Policy {
	t.Helper()
	m := fmt.Sprint(max)
	if auto {
		m = fmt.Sprintf("auto\nauto: {start: %d, floor: 100, ceiling: 2000}", max)
	}
	p, err := tiers.ParseYAML(fmt.Appendf(nil, `mode: enforce
shape: smooth
window: 500ms
max: %s
fleet:
  name: agent-auto
  store: %s
  max: 3000
  report: 50ms
  ttl: 1s
  fallback: share
select:
  - {proto: udp, ports: [514]}
`, m, store))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFleetAutoAgent: max: auto with a fleet (docs/design.md §12). Two
// agents share fleet.max 3000 through a real store: the auto member,
// offered 1000 per window with a learnt max of 300, and the other,
// offered 3000. The auto member passes what its learnt max passes on its
// own R̂ (the local P(1000)), where the fleet alone would give it about
// 1000 × P(4000)/4000; the other passes its fleet share 3000 ×
// P(4000)/4000, as if the auto member took its share: the fold is the auto
// member's own and what it reports is its R̂. Each within 5σ plus the
// pacing's 10 %. With the store gone the auto member's fallback max is the
// smaller of the share (3000 ÷ 2) and its learnt 300.
func TestFleetAutoAgent(t *testing.T) {
	testenv.Require(t)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	const (
		window  = 500 * time.Millisecond
		windows = 6
		rateA   = 1000.0 // the auto member's, per window
		rateB   = 3000.0
		learnt  = 300
	)
	polA := fleetAutoPolicy(t, r.URL(), learnt, true)
	polB := fleetAutoPolicy(t, r.URL(), 1000, false)
	a := startAgent(t, newPair(t), attach.XDPGeneric, polA)
	b := startAgent(t, newPair(t), attach.XDPGeneric, polB)
	ca, err := a.StartFleet(polA, agent.FleetMember{Name: "auto"})
	if err != nil {
		t.Fatalf("StartFleet with max: auto: %v", err)
	}
	if _, err := b.StartFleet(polB, agent.FleetMember{Name: "other"}); err != nil {
		t.Fatal(err)
	}
	fleetTab, err := tiers.Compile(polA, 0)
	if err != nil {
		t.Fatal(err)
	}
	local, err := tiers.Compile(polA.Local(), 0)
	if err != nil {
		t.Fatal(err)
	}
	frame := testenv.UDP4(t, 514)
	run := func(ag *agent.Agent) bool {
		ret, err := ag.Limiter().Program().Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		return ret == 2 // XDP_PASS
	}
	var offered, passed [2][windows]int
	var sent [2]float64
	var foldSeen bool
	pc := testenv.NewPacer(window, windows)
	for el := pc.Now(); el < pc.Span(); el = pc.Now() {
		k := int(el / window)
		for i, rate := range []float64{rateA, rateB} {
			ag := []*agent.Agent{a, b}[i]
			for due := rate * float64(el) / float64(window); sent[i] < due; sent[i]++ {
				offered[i][k]++
				if run(ag) {
					passed[i][k]++
				}
			}
		}
		if k >= 2 && !foldSeen {
			// The auto member's program judges on more than the store's
			// sum: the fold.
			_, o, err := a.Limiter().FleetOthers()
			if err != nil {
				t.Fatal(err)
			}
			foldSeen = float64(o) > gather(t, a).sum("tierlimit_fleet_others")
		}
		pc.Sleep()
	}
	if !foldSeen {
		t.Error("the auto member's program never judged on more than the store's others' sum")
	}
	check := func(who string, k, offered, passed int, want float64) {
		sigma := math.Sqrt(want * max(0, 1-want/float64(offered)))
		if math.Abs(float64(passed)-want) > 5*sigma+0.1*want {
			t.Errorf("window %d: %s passed %d, want %.0f ± (5 × %.1f + 10%%)", k, who, passed, want, sigma)
		}
	}
	for k := 2; k < windows; k++ {
		if !pc.Judged(t, k) {
			continue
		}
		oa, ob := offered[0][k], offered[1][k]
		rf := float64(oa + ob)
		share := fleetTab.Expected(uint64(rf)).Passed / rf
		wantA := local.Expected(uint64(oa)).Passed
		t.Logf("window %d: auto member offered %d passed %d (local P %.0f, its fleet share %.0f); other offered %d passed %d (fleet share %.0f)",
			k, oa, passed[0][k], wantA, float64(oa)*share, ob, passed[1][k], float64(ob)*share)
		check("the auto member", k, oa, passed[0][k], wantA)
		check("the other member", k, ob, passed[1][k], float64(ob)*share)
	}
	// What the auto member reports is its own R̂, not the fold.
	ms, err := ca.Members(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Name == "auto" && (m.Estimate < rateA/2 || m.Estimate > 2*rateA) {
			t.Errorf("the auto member reported %d; want its own R̂, about %.0f", m.Estimate, rateA)
		}
	}

	policyMax := func() float64 { return gather(t, a).sum("tierlimit_policy_max_packets") }
	r.Kill(t)
	if !soon(5*time.Second, func() bool { return policyMax() == learnt }) {
		t.Fatalf("the auto member's max %v with the store gone; want its learnt %d, below the share 3000 ÷ 2", policyMax(), learnt)
	}
	// Each member falls back on its own report clock: the other may be a
	// report behind the auto member.
	otherMax := func() float64 { return gather(t, b).sum("tierlimit_policy_max_packets") }
	if !soon(5*time.Second, func() bool { return otherMax() == 1500 }) {
		t.Errorf("the other member's max %v with the store gone; want the share 1500", otherMax())
	}
}

// TestFleetAutoLearnt: the fold follows the auto controller (docs/design.md
// §12, "With max: auto"). A member with max: auto starting at 300, offered
// 1000 per window alone in its fleet (fleet.max 3000 would pass all of it),
// sheds to its learnt max; its collector's socket, which the traffic run
// through the program never reaches, drops nothing, so the controller
// raises the max window after window, and each raise reaches the fold: the
// member passes what the learnt max in force passes on its own R̂, between
// the local P(1000) of the least and the greatest max seen over the window
// and the one before it, within 5σ plus 10 % below (the reports' pace) and
// 25 % above (a wall-clock window is not the limiter's; single windows
// were seen up to 17 % over). Were the fold's table not
// compiled again, the member would stay near P(1000) of 300 and fail
// below.
func TestFleetAutoLearnt(t *testing.T) {
	testenv.Require(t)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	const (
		window  = 200 * time.Millisecond
		windows = 14
		rate    = 1000.0
		start   = 300
	)
	pol, err := tiers.ParseYAML(fmt.Appendf(nil, `mode: enforce
shape: smooth
window: 200ms
max: auto
auto: {start: %d, floor: 100, ceiling: 2000}
fleet:
  name: agent-learnt
  store: %s
  max: 3000
  report: 50ms
  ttl: 1s
select:
  - {proto: udp, ports: [514]}
`, start, r.URL()))
	if err != nil {
		t.Fatal(err)
	}
	p := newPair(t)
	a := startAgent(t, p, attach.XDPGeneric, pol)
	var src automax.DropSource
	var coll *net.UDPConn
	if err := p.Coll.Do(func() (err error) {
		if coll, err = net.ListenUDP("udp", &net.UDPAddr{Port: 514}); err != nil {
			return err
		}
		src, err = automax.OpenDropSource(false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coll.Close() })
	if _, err := a.StartFleet(pol, agent.FleetMember{Name: "learnt"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	am, err := a.StartAutoMax(ctx, pol, src)
	if err != nil {
		src.Close()
		t.Fatal(err)
	}
	fleetTab, err := tiers.Compile(pol, 0)
	if err != nil {
		t.Fatal(err)
	}
	localP := func(m, offered uint64) float64 {
		tab, err := tiers.Compile(pol.Local().WithMax(m), 0)
		if err != nil {
			t.Fatal(err)
		}
		return tab.Expected(offered).Passed
	}
	frame := testenv.UDP4(t, 514)
	var offered, passed [windows]int
	lo, hi := [windows]uint64{}, [windows]uint64{}
	var sent float64
	// The controller holds its lock while it judges a window and applies
	// the new max (tens of ms): the max is read beside the paced loop,
	// never in it, so that the loop offers its packets on schedule.
	var learnt atomic.Uint64
	learnt.Store(am.Max())
	readMax, readDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			select {
			case <-readMax:
				return
			case <-time.After(time.Millisecond):
				learnt.Store(am.Max())
			}
		}
	}()
	pc := testenv.NewPacer(window, windows)
	for el := pc.Now(); el < pc.Span(); el = pc.Now() {
		k := int(el / window)
		m := learnt.Load()
		if lo[k] == 0 || m < lo[k] {
			lo[k] = m
		}
		hi[k] = max(hi[k], m)
		for due := rate * float64(el) / float64(window); sent < due; sent++ {
			offered[k]++
			ret, err := a.Limiter().Program().Run(&ebpf.RunOptions{Data: frame})
			if err != nil {
				t.Fatal(err)
			}
			if ret == 2 { // XDP_PASS
				passed[k]++
			}
		}
		pc.Sleep()
	}
	close(readMax)
	<-readDone
	if hi[windows-1] < 2*start {
		t.Fatalf("the learnt max reached %d; want it to climb past %d for the test to mean anything (history %+v)", hi[windows-1], 2*start, am.History())
	}
	if all := fleetTab.Expected(rate).Passed; all < 0.99*rate {
		t.Fatalf("the fleet alone passes %.0f of %.0f; want all", all, rate)
	}
	for k := 2; k < windows; k++ {
		if !pc.Judged(t, k) {
			continue
		}
		o := uint64(offered[k])
		least, most := localP(min(lo[k], lo[k-1]), o), localP(hi[k], o)
		below, above := 5*math.Sqrt(most)+0.1*least, 5*math.Sqrt(most)+0.25*most
		t.Logf("window %d: offered %d passed %d; learnt max %d..%d, local P %.0f..%.0f", k, o, passed[k], min(lo[k], lo[k-1]), hi[k], least, most)
		if float64(passed[k]) < least-below || float64(passed[k]) > most+above {
			t.Errorf("window %d: passed %d; want the local P of the learnt max in force, %.0f - %.0f to %.0f + %.0f", k, passed[k], least, below, most, above)
		}
	}
}
