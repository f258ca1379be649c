package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestFleetLicenseAgent: the door's wiring of one license for the fleet
// (docs/design.md §12): an agent whose policy has fleet: and license:,
// with its license guard started before its fleet controller, adds the
// bytes its program passed to the fleet's day in the store, where
// another member's adds join them, and its guard paces on the fleet's
// total: the store's day (status --license's reading) holds exactly the
// program's passed bytes and the other member's, and the guard's spend is
// that total.
func TestFleetLicenseAgent(t *testing.T) {
	testenv.Require(t)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	pol, err := tiers.ParseYAML(fmt.Appendf(nil, `mode: enforce
count: bytes
shape: smooth
window: 1s
max: 10MB
license: {per_day: 500GB, zone: America/Chicago}
fleet: {name: lic-e2e, store: %s, max: 10MB, report: 100ms, ttl: 1s}
select:
  - {proto: udp, ports: [514]}
`, r.URL()))
	if err != nil {
		t.Fatal(err)
	}
	other := &spendOnceLedger{bytes: 5000}
	ocfg := agent.FleetConfig(pol.Fleet, "other")
	ocfg.License = &fleet.License{Ledger: other, Day: agent.LicenseDay(pol.License)}
	oc, err := fleet.Start(ocfg, &otherMember{}, noFallback{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { oc.Close() })

	p := newPair(t)
	a := startAgent(t, p, attach.XDPAuto, pol)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := a.StartLicense(ctx, pol, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.StartFleet(pol, agent.FleetMember{Name: "agent"}); err != nil {
		t.Fatal(err)
	}
	// The guard counts from its first read of the program's counters, as
	// its run starts (agent/license).
	time.Sleep(200 * time.Millisecond)
	tx := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	if n, err := tx.Pace(ctx, 200, time.Second, 3*time.Second, func(i int) []byte { return testenv.SyslogMessage(0, i) }); err != nil || n != 200 {
		t.Fatalf("sent %d of 200: %v", n, err)
	}
	passed := func() uint64 {
		st, err := a.Limiter().Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.PassedBytes() // the payload bytes that passed, as the guard counts them
	}
	var d fleet.LicenseDay
	ok := soon(10*time.Second, func() bool {
		d, err = fleet.LicenseStatus(ctx, agent.FleetConfig(pol.Fleet, "status"), fleet.License{Day: agent.LicenseDay(pol.License)})
		return err == nil && passed() > 0 && d.Total == passed()+5000 && g.Snapshot().Spent == d.Total
	})
	if !ok {
		t.Fatalf("the store's day %+v (%v); the program passed %d bytes, the other member added 5000, the guard's spend %d",
			d, err, passed(), g.Snapshot().Spent)
	}
	if want := pol.License.DayOf(time.Now()).Start; !d.Start.Equal(want) || len(d.Members) != 2 {
		t.Errorf("the store's day starts %v with %d members; want %v (America/Chicago) and 2", d.Start, len(d.Members), want)
	}
}

// spendOnceLedger is another member's license ledger: bytes it hands
// over until the store acknowledges them.
type spendOnceLedger struct {
	mu    sync.Mutex
	bytes uint64
}

func (s *spendOnceLedger) TakeSpend() (uint64, func(bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.bytes
	return d, func(ok bool) {
		if ok {
			s.mu.Lock()
			s.bytes -= d
			s.mu.Unlock()
		}
	}
}

func (*spendOnceLedger) FleetSpent(time.Time, uint64, int) {}
func (*spendOnceLedger) Unreachable()                      {}
