package fleet_test

import (
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// viewKernel is a kernel whose view expires (fleet.ViewLimiter), as
// *bpf.Limiter's does: it records each view written.
type viewKernel struct {
	kernel
	vmu   sync.Mutex
	views []viewWrite
}

type viewWrite struct {
	in, total, expiry uint64
	at                uint64 // CLOCK_MONOTONIC when written
}

func (k *viewKernel) SetFleetView(in, total, expiry uint64) error {
	k.vmu.Lock()
	defer k.vmu.Unlock()
	k.views = append(k.views, viewWrite{in, total, expiry, mono()})
	return nil
}

func (k *viewKernel) last() (viewWrite, int) {
	k.vmu.Lock()
	defer k.vmu.Unlock()
	if len(k.views) == 0 {
		return viewWrite{}, 0
	}
	return k.views[len(k.views)-1], len(k.views)
}

// viewSide is an agentSide that is a fleet.Viewer.
type viewSide struct {
	agentSide
	vmu  sync.Mutex
	told [][2]uint64 // members, last share
}

func (a *viewSide) View(members int, last uint64) error {
	a.vmu.Lock()
	defer a.vmu.Unlock()
	a.told = append(a.told, [2]uint64{uint64(members), last})
	return nil
}

func (a *viewSide) lastTold() ([2]uint64, int) {
	a.vmu.Lock()
	defer a.vmu.Unlock()
	if len(a.told) == 0 {
		return [2]uint64{}, 0
	}
	return a.told[len(a.told)-1], len(a.told)
}

func mono() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

type viewMember struct {
	k   *viewKernel
	a   *viewSide
	log *syncBuf
	c   *fleet.Controller
}

func joinView(t *testing.T, cfg fleet.Config, est uint64) *viewMember {
	t.Helper()
	m := &viewMember{k: &viewKernel{kernel: kernel{estIn: est, est: est}}, a: &viewSide{}, log: &syncBuf{}}
	c, err := fleet.Start(cfg, m.k, m.a, slog.New(slog.NewTextHandler(m.log, nil)))
	if err != nil {
		t.Fatalf("start member %s: %v", cfg.Member, err)
	}
	m.c = c
	t.Cleanup(func() { c.Close() })
	return m
}

// The view a member writes expires (docs/design.md §12, "A view that
// expires"): each report answered writes the others' sums with an expiry
// of its answer + ttl, so a store that stops answering leaves the program
// a view that expires within ttl of the last answer, whether or not the
// agent still runs; fallback share writes 0 that never expires (the
// fallback policy is the fallback); leaving the fleet writes an expired
// view (0), so that a pinned program judges alone at once. The member
// count reaches the agent (fleet.Viewer) for the fallback the program
// applies alone, and fleet_view_age_seconds shows the view's age.
func TestFleetViewExpiry(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	cfg := testConfig(r.URL(), "view", "a")
	a := joinView(t, cfg, 100)
	join(t, testConfig(r.URL(), "view", "b"), 200)
	if !waitFor(20, func() bool { v, _ := a.k.last(); return v.total == 200 }) {
		t.Fatalf("member a never wrote b's 200 as its view")
	}
	v, _ := a.k.last()
	if lo, hi := v.at+uint64(testTTL)-uint64(testReport), v.at+uint64(testTTL); v.expiry < lo || v.expiry > hi {
		t.Errorf("view written at %d expires at %d: want its answer + ttl, in [%d, %d]", v.at, v.expiry, lo, hi)
	}
	if told, _ := a.a.lastTold(); told[0] != 2 || told[1] != 0 {
		t.Errorf("the agent was told %v; want 2 members and no last share (fallback share)", told)
	}
	if age := metric(t, a.c, "tierlimit_fleet_view_age_seconds"); age < 0 || age > 1 {
		t.Errorf("fleet_view_age_seconds %v while joined; want under a second", age)
	}

	// The store stops answering: the last view's expiry is within ttl of
	// the last answer; then fallback writes 0, forever.
	r.Signal(t, syscall.SIGSTOP)
	defer r.Signal(t, syscall.SIGCONT)
	stopped := mono()
	if !waitFor(40, func() bool { in, _, _, _ := a.a.state(); return in }) {
		t.Fatal("member a did not enter fallback")
	}
	fb, n := a.k.last()
	if fb.total != 0 || fb.in != 0 || fb.expiry != ^uint64(0) {
		t.Errorf("fallback share wrote view %+v; want 0, 0, never expiring", fb)
	}
	a.k.vmu.Lock()
	prev := a.k.views[n-2]
	a.k.vmu.Unlock()
	if prev.expiry > stopped+uint64(testTTL) {
		t.Errorf("the last view before fallback expires %v after the store stopped; want within ttl %v",
			time.Duration(prev.expiry-stopped), testTTL)
	}
	if age := metric(t, a.c, "tierlimit_fleet_view_age_seconds"); age < testTTL.Seconds() {
		t.Errorf("fleet_view_age_seconds %v in fallback; want at least ttl", age)
	}
	r.Signal(t, syscall.SIGCONT)
	if !waitFor(40, func() bool { in, _, _, _ := a.a.state(); return !in }) {
		t.Fatal("member a did not rejoin")
	}
	a.c.Close()
	if v, _ := a.k.last(); v.expiry != 0 || v.total != 0 {
		t.Errorf("after Close the view is %+v; want expired (0) and 0", v)
	}
}

// fallback last (docs/design.md §12, Partitions): a member keeps its last
// share, own R̂ ÷ R̂_fleet × fleet.max, told to the agent at each report;
// in fallback its view holds until the share decays, FleetLastHold × ttl
// after it entered fallback, when the agent is told share (0) and the
// view never expires again.
func TestFleetFallbackLast(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	cfg := testConfig(r.URL(), "last", "a")
	cfg.Fallback, cfg.TTL = fleet.FallbackLast, 300*time.Millisecond
	a := joinView(t, cfg, 600)
	cb := cfg
	cb.Member = "b"
	join(t, cb, 400)
	if !waitFor(20, func() bool { told, _ := a.a.lastTold(); return told == [2]uint64{2, 600} }) {
		told, _ := a.a.lastTold()
		t.Fatalf("the agent was told %v; want 2 members and a last share of 600 of 1000", told)
	}
	r.Signal(t, syscall.SIGSTOP)
	defer r.Signal(t, syscall.SIGCONT)
	if !waitFor(40, func() bool { in, _, _, _ := a.a.state(); return in }) {
		t.Fatal("member a did not enter fallback")
	}
	entered := time.Now()
	fb, _ := a.k.last()
	hold := uint64(tiers.FleetLastHold * cfg.TTL)
	if fb.total != 0 || fb.expiry < fb.at+hold-uint64(testReport) || fb.expiry > fb.at+hold {
		t.Errorf("fallback last wrote view %+v; want 0 until %v after", fb, time.Duration(hold))
	}
	if !waitFor(60, func() bool { told, _ := a.a.lastTold(); return told[1] == 0 }) {
		t.Fatalf("the last share did not decay within %v", time.Since(entered))
	}
	held := time.Since(entered)
	if held < time.Duration(hold)-2*testReport {
		t.Errorf("the last share decayed after %v; want %v", held, time.Duration(hold))
	}
	if v, _ := a.k.last(); v.expiry != ^uint64(0) {
		t.Errorf("after the decay the view is %+v; want never expiring", v)
	}
	if in, entries, _, bad := a.a.state(); !in || len(entries) != 1 || bad != "" {
		t.Errorf("fallback %v, EnterFallback %v, %s; want one, still in", in, entries, bad)
	}
}
