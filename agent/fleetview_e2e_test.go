package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestFleetAgentView: the agent's side of the view that expires
// (docs/design.md §12, "A view that expires"). Applying a fleet policy
// before its controller's first report writes an expired view and the
// fallback the program applies alone (the local max, no member count
// seen): a new program judges on the fallback, never on a view it has not
// read. Joined with one other member, each report writes the others' sum
// with an expiry of ttl, and the fallback follows the member count
// (share of 2). With fallback last, the fallback alone is still share's.
func TestFleetAgentView(t *testing.T) {
	testenv.Require(t)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	policy := func(fb string) tiers.Policy {
		pol, err := tiers.ParseYAML(fmt.Appendf(nil, `mode: enforce
shape: smooth
window: 1s
max: 2000
fleet: {name: agent-view, store: %s, max: 3000, report: 100ms, ttl: 1s, fallback: %s}
select:
  - {proto: udp, ports: [514]}
`, r.URL(), fb))
		if err != nil {
			t.Fatal(err)
		}
		return pol
	}
	pol := policy("share")
	other := &otherMember{estIn: 1200, est: 1200}
	oc, err := fleet.Start(fleet.Config{Name: "agent-view", Member: "other", Store: r.URL(),
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
	t.Cleanup(func() { a.Close() })
	exp, mult, stale, err := a.Limiter().FleetView()
	if err != nil {
		t.Fatal(err)
	}
	if want := tiers.FleetFallbackMult(3000, 2000); exp != 0 || !stale || mult != want {
		t.Errorf("before the first report: expiry %d, stale %v, multiplier %d; want expired (0) and %d (the local max 2000)", exp, stale, mult, want)
	}
	if _, err := a.StartFleet(pol, agent.FleetMember{Name: "agent"}); err != nil {
		t.Fatal(err)
	}
	share2 := tiers.FleetFallbackMult(3000, 1500)
	var at uint64
	if !soon(5*time.Second, func() bool {
		exp, mult, stale, _ = a.Limiter().FleetView()
		at = mono(t)
		return !stale && mult == share2
	}) {
		t.Fatalf("joined: expiry %d, stale %v, multiplier %d; want a view that holds and %d (share of 2)", exp, stale, mult, share2)
	}
	if exp > at+uint64(time.Second) || exp+uint64(time.Second) < at {
		t.Errorf("joined: the view expires %v from now; want within ttl (1s)", time.Duration(exp-at))
	}
	if err := a.Reload(context.Background(), policy("last")); err != nil {
		t.Fatal(err)
	}
	if _, mult, _, _ = a.Limiter().FleetView(); mult != share2 {
		t.Errorf("fallback last: the program's fallback alone is %d; want share's %d", mult, share2)
	}
}

func mono(t *testing.T) uint64 {
	t.Helper()
	n, err := bpf.MonotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
