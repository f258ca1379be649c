package fleet_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// risingKernel is a kernel that can be polled (FleetPoll) and takes what
// the others' sums answer (SetFleetOwn), recording each.
type risingKernel struct {
	kernel
	mu    sync.Mutex
	polls int
	own   [][3]uint64 // in, total, members of each SetFleetOwn
}

func (k *risingKernel) FleetPoll() (uint64, error) {
	k.mu.Lock()
	k.polls++
	k.mu.Unlock()
	_, total, err := k.FleetEstimate()
	return total, err
}

func (k *risingKernel) SetFleetOwn(in, total, members uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.own = append(k.own, [3]uint64{in, total, members})
	return nil
}

func (k *risingKernel) owns() [][3]uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([][3]uint64(nil), k.own...)
}

// The fleet's first second in the controller (docs/design.md §12): with
// report 1 s, a member polls its program every 100 ms; when its R̂ more
// than doubles it reports at once, so the other member's sum follows
// in the store within a few polls, not at the next regular report; with each answer
// the program is handed the member's own R̂ at the report and the member
// count, before the sums; idle (R̂ 0) at its last report, its reports
// at a poll hand it 0 (the equal-share prior; at a poll the base of the
// rise is kept until the next regular report), the regular report its R̂;
// a rise by less than double at a regular pace reports nothing early.
func TestFleetEarlyReport(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	cfg := func(member string) fleet.Config {
		c := testConfig(r.URL(), "first", member)
		c.Report, c.TTL = time.Second, 5*time.Second
		return c
	}
	start := func(member string, k fleet.Limiter) *fleet.Controller {
		c, err := fleet.Start(cfg(member), k, &agentSide{}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a := &risingKernel{}
	other := &kernel{}
	ca := start("a", a)
	start("other", other)
	// stored is a's estimate in the store.
	entry := func() (uint64, time.Time) {
		ms, err := ca.Members(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Name == "a" {
				return m.Estimate, m.Heard
			}
		}
		return 0, time.Time{}
	}
	stored := func() uint64 { e, _ := entry(); return e }
	// Both have joined; wait for a regular report of each to have
	// passed, so that the next is up to a second away.
	time.Sleep(1100 * time.Millisecond)
	t0 := time.Now()
	a.set(1000)
	if !waitFor(4, func() bool { return stored() == 1000 }) {
		t.Fatalf("a's estimate in the store is %d 400 ms after its R̂ rose from 0 to 1000; want its early report", stored())
	}
	t.Logf("a's rise reached the store after %v (report 1s, poll 100ms)", time.Since(t0))
	own := a.owns()
	var firstEarly, second int = -1, -1
	for i, o := range own {
		if o[2] != 2 && i > 0 {
			t.Errorf("SetFleetOwn %v: members %d, want 2", o, o[2])
		}
		if firstEarly < 0 && o == [3]uint64{0, 0, 2} && i > 0 {
			firstEarly = i
		}
	}
	if firstEarly < 0 {
		t.Fatalf("SetFleetOwn calls %v: want the first early report's own at 0 (idle at the last report: the prior)", own)
	}
	a.set(1300) // a quarter and a bit: reported again at a poll after an early report
	if !waitFor(4, func() bool { return stored() == 1300 }) {
		t.Errorf("a's estimate in the store is %d after its R̂ rose by 30 %% after an early report; want a report at a poll", stored())
	}
	// At a poll the base of the rise is kept (0 here: the prior) until
	// the next regular report, which hands the program a's R̂.
	for i, o := range a.owns()[firstEarly:] {
		if o[1] != 0 {
			t.Errorf("SetFleetOwn at the %d-th report at a poll: %v; want the base kept (0, the prior) until the regular report", i+1, o)
		}
	}
	// A rise by less than double after a regular report: no early report.
	// The regular report is the first after a second with no rise.
	time.Sleep(1100 * time.Millisecond)
	_, heard := entry()
	if !waitFor(12, func() bool { _, h := entry(); return h.After(heard) }) {
		t.Fatal("no regular report within 1.2 s")
	}
	own = a.owns()
	for i := firstEarly + 1; i < len(own); i++ {
		if own[i][1] >= 1000 {
			second = i
			break
		}
	}
	if second < 0 {
		t.Errorf("SetFleetOwn calls %v: want a's own R̂ at the regular report after the prior's", own)
	}
	a.set(2000)
	time.Sleep(500 * time.Millisecond)
	if got := stored(); got == 2000 {
		a.mu.Lock()
		polls := a.polls
		a.mu.Unlock()
		t.Errorf("a reported a rise from 1300 to 2000 within 500 ms (%d polls); want it at the regular report only", polls)
	}
}
