package agent_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// otherMember stands where another host's program stands: the estimates
// it reports (in budget, total), the others' sums it is handed.
type otherMember struct {
	mu                    sync.Mutex
	estIn, est            uint64
	othersIn, othersTotal uint64
}

func (o *otherMember) FleetEstimate() (uint64, uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.estIn, o.est, nil
}

func (o *otherMember) SetFleetOthers(in, total uint64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.othersIn, o.othersTotal = in, total
	return nil
}

type noFallback struct{}

func (noFallback) EnterFallback(int) error { return nil }
func (noFallback) LeaveFallback() error    { return nil }

// soon polls cond every 50 ms for up to d and says whether it held.
func soon(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// TestFleetAgent: the agent's fleet wiring (docs/design.md §12). The
// agent's controller writes the other member's estimate into its program;
// with the store gone for ttl it applies the share fallback (fleet.max ÷
// the 2 members last seen) and writes 0; with the store back it applies
// the fleet's policy again; Close leaves the fleet, and the other member
// stops counting it.
func TestFleetAgent(t *testing.T) {
	testenv.Require(t)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	pol, err := tiers.ParseYAML(fmt.Appendf(nil, `mode: enforce
shape: smooth
window: 1s
max: 2000
fleet:
  name: agent-e2e
  store: %s
  max: 3000
  report: 100ms
  ttl: 1s
  fallback: share
select:
  - {proto: udp, ports: [514]}
`, r.URL()))
	if err != nil {
		t.Fatal(err)
	}
	other := &otherMember{estIn: 800, est: 1200} // 400 of its 1200 over budget
	oc, err := fleet.Start(fleet.Config{Name: "agent-e2e", Member: "other", Store: r.URL(),
		Report: 100 * time.Millisecond, TTL: time.Second}, other, noFallback{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { oc.Close() })

	p := newPair(t)
	a, err := newAgent(p, agent.Config{}, pol)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			a.Close()
		}
	})
	c, err := a.StartFleet(pol, agent.FleetMember{Name: "agent"})
	if err != nil || c == nil {
		t.Fatalf("StartFleet: %v, %v", c, err)
	}
	// The program's others' total, and its in-budget sum checked to be
	// the other member's 800 whenever the total is its 1200.
	fleetOthers := func() uint64 {
		in, v, err := a.Limiter().FleetOthers()
		if err != nil {
			t.Fatal(err)
		}
		if v == 1200 && in != 800 {
			t.Errorf("the program's others' sums %d, %d; want the other member's 800 in budget of 1200", in, v)
		}
		if v == 0 && in != 0 {
			t.Errorf("the program's others' sums %d, %d; want 0, 0", in, v)
		}
		return v
	}
	policyMax := func() float64 { return gather(t, a).sum("tierlimit_policy_max_packets") }
	if !soon(5*time.Second, func() bool { return fleetOthers() == 1200 }) {
		t.Fatalf("the program's others' sum is %d; want the other member's 1200", fleetOthers())
	}
	if n := testutil.CollectAndCount(c, "tierlimit_fleet_members"); n != 1 {
		t.Errorf("fleet_members series %d", n)
	}
	if _, err := testutil.GatherAndCount(a.Registry(), "tierlimit_fleet_members"); err != nil {
		t.Errorf("the agent's registry does not gather the fleet's metrics: %v", err)
	}
	fleetMax := policyMax()

	r.Kill(t)
	if !soon(5*time.Second, func() bool { return policyMax() == 1500 }) {
		t.Fatalf("policy max %v with the store gone; want the share 3000 ÷ 2 = 1500", policyMax())
	}
	if got := fleetOthers(); got != 0 {
		t.Errorf("others' sum %d in fallback; want 0", got)
	}
	r.Restart(t)
	if !soon(5*time.Second, func() bool { return policyMax() == fleetMax && fleetOthers() == 1200 }) {
		t.Fatalf("after the store came back: policy max %v, others %d; want %v and 1200", policyMax(), fleetOthers(), fleetMax)
	}

	members := func() int {
		ms, err := oc.Members(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(ms)
	}
	if !soon(5*time.Second, func() bool { return members() == 2 }) {
		t.Fatalf("the store lists %d members; want the agent and the other", members())
	}
	closed = true
	if err := a.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	// The agent left: its entry is gone at once, not after the ttl.
	if got := members(); got != 1 {
		t.Errorf("the store lists %d members after the agent closed; want 1", got)
	}
}
