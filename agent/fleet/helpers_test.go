package fleet_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/tierlimit/tierlimit/agent/fleet"
)

// kernel stands where *bpf.Limiter stands: the program's side of the seam.
// It holds an estimate the test sets and records every call.
type kernel struct {
	mu        sync.Mutex
	estIn     uint64
	est       uint64
	othersIn  uint64
	others    uint64
	estCalls  int
	setCalls  int
	history   []uint64 // every others' total handed in, in order
	historyIn []uint64 // and every in-budget sum
}

func (k *kernel) FleetEstimate() (uint64, uint64, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.estCalls++
	return k.estIn, k.est, nil
}

func (k *kernel) SetFleetOthers(in, total uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.setCalls++
	k.othersIn, k.others = in, total
	k.history = append(k.history, total)
	k.historyIn = append(k.historyIn, in)
	return nil
}

// set sets the estimate, all in budget.
func (k *kernel) set(est uint64) { k.setPair(est, est) }

// setPair sets the in-budget estimate and the total.
func (k *kernel) setPair(in, est uint64) {
	k.mu.Lock()
	k.estIn, k.est = in, est
	k.mu.Unlock()
}

func (k *kernel) calls() (est, set int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.estCalls, k.setCalls
}

func (k *kernel) othersNow() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.others
}

func (k *kernel) othersPair() (in, total uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.othersIn, k.others
}

// agentSide stands where the agent's policy switch stands.
type agentSide struct {
	mu      sync.Mutex
	entered []int // the members of each EnterFallback
	left    int
	in      bool
	bad     string // a call out of order
}

func (a *agentSide) EnterFallback(members int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.in {
		a.bad = "EnterFallback while in fallback"
	}
	a.in = true
	a.entered = append(a.entered, members)
	return nil
}

func (a *agentSide) LeaveFallback() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.in {
		a.bad = "LeaveFallback while not in fallback"
	}
	a.in = false
	a.left++
	return nil
}

func (a *agentSide) state() (in bool, entered []int, left int, bad string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.in, append([]int(nil), a.entered...), a.left, a.bad
}

// syncBuf is a log buffer that several goroutines write.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// member is one in-process member of a fleet.
type member struct {
	name string
	k    *kernel
	a    *agentSide
	log  *syncBuf
	c    *fleet.Controller
}

const (
	testReport = 100 * time.Millisecond
	testTTL    = time.Second
)

func testConfig(store, name, member string) fleet.Config {
	return fleet.Config{Name: name, Member: member, Store: store, Max: 1000,
		Report: testReport, TTL: testTTL, Fallback: fleet.FallbackShare}
}

// join starts a member with estimate est; Close in Cleanup.
func join(t *testing.T, cfg fleet.Config, est uint64) *member {
	t.Helper()
	return joinPair(t, cfg, est, est)
}

// joinPair starts a member with estimates in (in budget) and est (all
// its traffic); Close in Cleanup.
func joinPair(t *testing.T, cfg fleet.Config, in, est uint64) *member {
	t.Helper()
	m := &member{name: cfg.Member, k: &kernel{estIn: in, est: est}, a: &agentSide{}, log: &syncBuf{}}
	c, err := fleet.Start(cfg, m.k, m.a, slog.New(slog.NewTextHandler(m.log, nil)))
	if err != nil {
		t.Fatalf("start member %s: %v", cfg.Member, err)
	}
	m.c = c
	t.Cleanup(func() { c.Close() })
	return m
}

// waitFor polls cond every report until it holds or n reports of time
// went by; it returns whether it held. The bound is generous: what the
// tests assert is counted in reports (kernel calls), not in time.
func waitFor(n int, cond func() bool) bool {
	deadline := time.Now().Add(time.Duration(n) * testReport)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(testReport / 4)
	}
}

// metric reads one of the controller's metrics.
func metric(t *testing.T, c *fleet.Controller, name string, labels ...string) float64 {
	t.Helper()
	got, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, name)
	if err != nil {
		t.Fatalf("collect %s: %v", name, err)
	}
	want := name
	if len(labels) > 0 {
		want += "{" + strings.Join(labels, ",") + "}"
	}
	for _, line := range strings.Split(string(got), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == want {
			var v float64
			fmt.Sscan(f[1], &v)
			return v
		}
	}
	t.Fatalf("metric %s not found in:\n%s", want, got)
	return 0
}

// fleetConfig is fleet.Config, for helpers that copy one.
type fleetConfig = fleet.Config
