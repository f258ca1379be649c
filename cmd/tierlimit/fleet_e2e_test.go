package main

// The fleet end to end (docs/design.md §12, issue 34): redis-server in its
// own namespace, three members each running the tierlimit binary in its
// own collector namespace, joined to the store's by a bridge, each flooded
// by its own sender over its own veth.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

const (
	e2eFleetMax = 600
	e2eWindow   = time.Second
	e2eReport   = 100 * time.Millisecond
	e2eTTL      = time.Second
	// e2eSlack is what the timing checks allow beyond the contract's
	// bound, for scraping /metrics and reading the logs on a shared
	// machine.
	e2eSlack = 250 * time.Millisecond
)

// e2ePolicy is the members' policy: fleet.max 600 per 1 s window, or with
// fleet empty, the static max of fleet.max ÷ 3 on each.
func e2ePolicy(store string, fleet bool) string {
	p := fmt.Sprintf(`mode: enforce
shape: smooth
window: 1s
max: %d
tiers: [{at: 70%%, drop: 20%%}, {at: 80%%, drop: 50%%}, {at: 100%%, drop: 100%%}]
select: [{proto: udp, ports: [514]}]
`, e2eFleetMax/3)
	if fleet {
		p += fmt.Sprintf("fleet: {name: tle2e, store: %q, max: %d, report: %s, ttl: %s, fallback: share}\n", store, e2eFleetMax, e2eReport, e2eTTL)
	}
	return p
}

// TestFleetE2E: sharing, join and leave, and the store's faults.
//
//   - Sharing: 3 × fleet.max per window split 60/30/10; from the third
//     window on, the members' passes per window sum to P(R_fleet) (the
//     table compiled for fleet.max), each member passes the same fraction
//     of its offered load, and what the fleet model (model.FleetModel)
//     passes of the same rates; within 5σ plus the pacing's 10 % (as
//     bpf's TestFleetProgramsSharing). The same flood with fleet off and a
//     static max of fleet.max ÷ 3 is logged beside it.
//   - Leave: a member stopped with SIGTERM is out of the others' count
//     within ttl, and the others' sum follows within one window. Join: a
//     member started mid-flood is counted within 2 reports.
//   - Store: stopped (SIGSTOP) for half the ttl, reports are slow, no
//     member falls back and the collectors still receive. Killed, every member is in fallback within ttl
//     (tierlimit_fleet_fallback 1, said once in its log); restarted, every
//     member rejoins within 1 s and 2 reports (a refused address is
//     probed once a second: docs/design.md §12, "Connections").
//
// The timing checks allow e2eSlack beyond each bound.
func TestFleetE2E(t *testing.T) {
	testenv.Require(t)
	testenv.RequireRedis(t)
	bin := cli(t)
	lab, rd := startFleetLab(t, "tltest", bin, 3, labOpts{})
	fleetCfg, err := lab.writePolicy("fleet.yaml", e2ePolicy(rd.URL(), true))
	if err != nil {
		t.Fatal(err)
	}
	staticCfg, err := lab.writePolicy("static.yaml", e2ePolicy(rd.URL(), false))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := tiers.LoadFile(fleetCfg)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := tiers.Compile(pol, 0)
	if err != nil {
		t.Fatal(err)
	}
	R := 3 * e2eFleetMax
	rates := []int{R * 6 / 10, R * 3 / 10, R / 10}
	each := func(int) []int { return rates }
	ctx := context.Background()

	// Fleet off, static max fleet.max ÷ 3: logged, not asserted.
	for i := range lab.members {
		if err := lab.start(i, fmt.Sprintf("m%d", i), staticCfg, ""); err != nil {
			t.Fatal(err)
		}
	}
	const staticWindows = 4
	sent, err := lab.flood(ctx, 0, staticWindows, e2eWindow, each)
	if err != nil {
		t.Fatal(err)
	}
	lab.settle(100 * time.Millisecond)
	for i := range lab.members {
		if err := lab.stop(i, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	static := logWindows(t, "static max 200 each", lab, sent, 0, tab)

	// Fleet on.
	for i := range lab.members {
		if err := lab.start(i, fmt.Sprintf("m%d", i), fleetCfg, "joined the fleet"); err != nil {
			t.Fatal(err)
		}
	}
	const windows, first = 6, 10
	sent, err = lab.flood(ctx, first, windows, e2eWindow, each)
	if err != nil {
		t.Fatal(err)
	}
	lab.settle(100 * time.Millisecond)
	shared := logWindows(t, "fleet", lab, sent, first, tab)
	t.Logf("from the third window on, the fleet passed %d (static split: %d) of %d offered", shared, static, R*(windows-2))
	checkSharing(t, lab, sent, first, tab, pol, rates)

	// Join, leave and the store's faults, under a flood that goes on.
	fctx, stopFlood := context.WithCancel(ctx)
	flooded := make(chan error, 1)
	go func() {
		_, err := lab.flood(fctx, 100, 20, e2eWindow, each)
		flooded <- err
	}()
	defer func() { stopFlood(); <-flooded }()
	time.Sleep(2 * e2eWindow)
	checkLeaveJoin(t, lab, fleetCfg)
	checkStoreFaults(t, lab, rd)
}

// logWindows logs each window's offered and passed per member and the
// fleet's total beside P(R_fleet), and returns what the fleet passed from
// the third window on.
func logWindows(t *testing.T, what string, lab *fleetLab, sent [][]int, first int, tab tiers.Table) int {
	t.Helper()
	total := 0
	for k := range sent[0] {
		var b strings.Builder
		off, pass := 0, 0
		for i := range sent {
			p := lab.passed(i, first+k)
			fmt.Fprintf(&b, " m%d %d/%d", i, p, sent[i][k])
			off += sent[i][k]
			pass += p
		}
		if k >= 2 {
			total += pass
		}
		t.Logf("%s window %d: passed/offered%s; fleet %d/%d, P(R_fleet) %.0f", what, k, b.String(), pass, off, tab.Expected(uint64(off)).Passed)
	}
	return total
}

// checkSharing asserts the sharing from the third window on (see
// TestFleetE2E).
func checkSharing(t *testing.T, lab *fleetLab, sent [][]int, first int, tab tiers.Table, pol tiers.Policy, rates []int) {
	t.Helper()
	windows := len(sent[0])
	memOff, memPass := make([]int, len(sent)), make([]int, len(sent))
	var fleetOff, fleetPass float64
	for k := 2; k < windows; k++ {
		off, pass := 0, 0
		for i := range sent {
			p := lab.passed(i, first+k)
			off += sent[i][k]
			pass += p
			memOff[i] += sent[i][k]
			memPass[i] += p
		}
		want := tab.Expected(uint64(off)).Passed
		fl := want / float64(off)
		fleetOff, fleetPass = fleetOff+float64(off), fleetPass+want
		sigma := math.Sqrt(float64(off) * fl * (1 - fl))
		if math.Abs(float64(pass)-want) > 5*sigma+0.1*want {
			t.Errorf("window %d: the fleet passed %d of %d, want P(R_fleet) %.0f ± (5 × %.1f + 10%%)", k, pass, off, want, sigma)
		}
	}
	frac := fleetPass / fleetOff
	// The fleet model on the same rates, evenly spaced.
	f := model.NewFleetModel(pol, tab, len(rates), e2eReport, rand.New(rand.NewPCG(34, 3)).Uint32)
	modelPass := make([]int, len(rates))
	next := make([]float64, len(rates))
	W := float64(e2eWindow)
	for {
		i := 0
		for j := range next {
			if next[j] < next[i] {
				i = j
			}
		}
		if next[i] >= float64(windows)*W {
			break
		}
		if d := f.Packet(i, uint64(next[i])); d.Verdict == tiers.VerdictPass && next[i] >= 2*W {
			modelPass[i]++
		}
		next[i] += W / float64(rates[i])
	}
	for i := range sent {
		got := float64(memPass[i]) / float64(memOff[i])
		sigma := math.Sqrt(frac * (1 - frac) / float64(memOff[i]))
		t.Logf("member %d: passed %d of %d (%.3f), the fleet's fraction %.3f; the fleet model passes %d", i, memPass[i], memOff[i], got, frac, modelPass[i])
		if math.Abs(got-frac) > 5*sigma+0.1*frac {
			t.Errorf("member %d: passed %.3f of its offered, want the fleet's %.3f ± (5 × %.3f + 10%%)", i, got, frac, sigma)
		}
		if mp := float64(modelPass[i]); math.Abs(float64(memPass[i])-mp) > 5*math.Sqrt(mp)+0.1*mp {
			t.Errorf("member %d: passed %d, the fleet model %d ± (5σ + 10%%)", i, memPass[i], modelPass[i])
		}
	}
}

// within polls cond every 10 ms for up to limit; it returns how long
// cond took to hold, or false.
func within(limit time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > limit {
			return time.Since(start), false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// allWithin polls cond for every member every 10 ms, all from now, for up
// to limit; it returns how long each took to hold, -1 for those it never
// held for.
func allWithin(lab *fleetLab, limit time.Duration, cond func(i int) bool) []time.Duration {
	start := time.Now()
	out := make([]time.Duration, len(lab.members))
	left := len(out)
	for i := range out {
		out[i] = -1
	}
	for left > 0 && time.Since(start) <= limit {
		for i := range out {
			if out[i] < 0 && cond(i) {
				out[i] = time.Since(start)
				left--
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return out
}

// gauge scrapes member i's metric name, -1 when it cannot.
func gauge(t *testing.T, lab *fleetLab, i int, name string) float64 {
	t.Helper()
	m, err := lab.metrics(i)
	if err != nil {
		t.Logf("member %d /metrics: %v", i, err)
		return -1
	}
	v, ok := m[name]
	if !ok {
		return -1
	}
	return v
}

// own is member i's own estimate as it last reported: the fleet's
// offered load less the others'.
func own(t *testing.T, lab *fleetLab, i int) float64 {
	return gauge(t, lab, i, "tierlimit_fleet_offered") - gauge(t, lab, i, "tierlimit_fleet_others")
}

func checkLeaveJoin(t *testing.T, lab *fleetLab, cfg string) {
	t.Helper()
	own1, own2 := own(t, lab, 1), own(t, lab, 2)
	t.Logf("before the leave: m0 others %.0f, m1 own %.0f, m2 own %.0f", gauge(t, lab, 0, "tierlimit_fleet_others"), own1, own2)
	if n := gauge(t, lab, 0, "tierlimit_fleet_members"); n != 3 {
		t.Errorf("m0 counts %v members before the leave, want 3", n)
	}
	if err := lab.stop(2, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	d, ok := within(e2eTTL+e2eSlack, func() bool { return gauge(t, lab, 0, "tierlimit_fleet_members") == 2 })
	t.Logf("m2 stopped: m0 counts 2 members after %v", d)
	if !ok {
		t.Errorf("m0 still counts m2 %v after it stopped; want it out within ttl %v", d, e2eTTL)
	}
	d, ok = within(e2eWindow+e2eSlack, func() bool {
		o0, o1 := gauge(t, lab, 0, "tierlimit_fleet_others"), own(t, lab, 1)
		return math.Abs(o0-o1) < own2/2
	})
	t.Logf("m0's others' sum follows m1's own estimate (%.0f ~ %.0f) after another %v",
		gauge(t, lab, 0, "tierlimit_fleet_others"), own(t, lab, 1), d)
	if !ok {
		t.Errorf("m0's others' sum %v is not m1's own %v (± %v) within a window of the leave",
			gauge(t, lab, 0, "tierlimit_fleet_others"), own(t, lab, 1), own2/2)
	}

	// A member started mid-flood, on m2's collector, under a new name.
	if err := lab.start(2, "m3", cfg, "joined the fleet"); err != nil {
		t.Fatal(err)
	}
	d, ok = within(2*e2eReport+e2eSlack, func() bool { return gauge(t, lab, 0, "tierlimit_fleet_members") == 3 })
	t.Logf("m3 joined mid-flood: m0 counts 3 members %v after its join", d)
	if !ok {
		t.Errorf("m0 does not count m3 within 2 reports (%v) of its join", 2*e2eReport)
	}
}

func checkStoreFaults(t *testing.T, lab *fleetLab, rd *testenv.Redis) {
	t.Helper()
	// Every member has counted the 3 members before the store goes, so that
	// the share fallback is fleet.max ÷ 3 on each.
	for i, d := range allWithin(lab, 2*e2eReport+e2eSlack, func(i int) bool { return gauge(t, lab, i, "tierlimit_fleet_members") == 3 }) {
		if d < 0 {
			t.Errorf("member %d does not count 3 members", i)
		}
	}
	// A store that hangs (SIGSTOP) for less than ttl: reports are slow, no
	// member falls back, and limiting goes on.
	slow := make([]float64, len(lab.members))
	for i := range lab.members {
		slow[i] = gauge(t, lab, i, `tierlimit_fleet_reports_total{result=slow}`)
	}
	before := 0
	for i := range lab.members {
		before += int(lab.members[i].recv.Count())
	}
	rd.Signal(t, syscall.SIGSTOP)
	time.Sleep(e2eTTL / 2)
	for i := range lab.members {
		if v := gauge(t, lab, i, `tierlimit_fleet_reports_total{result=slow}`); v <= max(slow[i], 0) {
			t.Errorf("member %d: %v slow reports with the store stopped, want more than %v", i, v, slow[i])
		}
		if v := gauge(t, lab, i, "tierlimit_fleet_fallback"); v != 0 {
			t.Errorf("member %d in fallback %v within ttl of the store stopping", i, v)
		}
	}
	rd.Signal(t, syscall.SIGCONT)
	after := 0
	for i := range lab.members {
		after += int(lab.members[i].recv.Count())
	}
	// Half a window at 3 × fleet.max passes about P(R_fleet) / 2.
	t.Logf("store stopped for %v: the collectors received %d meanwhile", e2eTTL/2, after-before)
	if after-before < e2eFleetMax/10 {
		t.Errorf("the collectors received %d in the %v the store was stopped; limiting must go on", after-before, e2eTTL/2)
	}
	for i, d := range allWithin(lab, 2*e2eReport+e2eSlack, func(i int) bool { return gauge(t, lab, i, "tierlimit_fleet_store_up") == 1 }) {
		if d < 0 {
			t.Errorf("member %d: the store is not up again after SIGCONT", i)
		}
	}

	rd.Kill(t)
	for i, d := range allWithin(lab, e2eTTL+e2eReport+e2eSlack, func(i int) bool { return gauge(t, lab, i, "tierlimit_fleet_fallback") == 1 }) {
		t.Logf("store killed: member %d in fallback after %v", i, d)
		if d < 0 {
			t.Errorf("member %d not in fallback within ttl %v (+ a report) of the store's end", i, e2eTTL)
		}
	}
	// The share fallback: fleet.max ÷ the 3 members last seen.
	for i := range lab.members {
		if v := gauge(t, lab, i, "tierlimit_policy_max_packets"); v != e2eFleetMax/3 {
			t.Errorf("member %d: policy max %v in fallback, want fleet.max ÷ 3 = %d", i, v, e2eFleetMax/3)
		}
	}
	rd.Restart(t)
	for i, d := range allWithin(lab, time.Second+2*e2eReport+e2eSlack, func(i int) bool { return gauge(t, lab, i, "tierlimit_fleet_fallback") == 0 }) {
		t.Logf("store back: member %d rejoined after %v", i, d)
		if d < 0 {
			t.Errorf("member %d did not rejoin within 1 s and 2 reports (%v) of the store's return", i, time.Second+2*e2eReport)
		}
	}
	for i := range lab.members {
		log := lab.logOf(i)
		if n := strings.Count(log, "in fallback"); n != 1 {
			t.Errorf("member %d says it is in fallback %d times, want once", i, n)
		}
		if n := strings.Count(log, "rejoined the fleet"); n != 1 {
			t.Errorf("member %d says it rejoined %d times, want once", i, n)
		}
	}
}

// TestFleetSIGHUP: the tierlimit binary, a member of a fleet whose store
// (in its own namespace) changes its password and drops its connections,
// is refused (backing off) until password_file has the new password, and
// then reports again with no SIGHUP (issue 40: the file is read at every
// new connection); a SIGHUP after that changes nothing.
func TestFleetSIGHUP(t *testing.T) {
	testenv.Require(t)
	testenv.RequireRedis(t)
	lab, rd := startFleetLab(t, "tltest", cli(t), 1, labOpts{redis: testenv.RedisOptions{Password: "first-one"}})
	pw, err := lab.writePolicy("fleet.secret", "first-one\n")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := lab.writePolicy("fleet.yaml", fmt.Sprintf(`shape: smooth
max: 200
select: [{proto: udp, ports: [514]}]
fleet: {name: tlhup, store: %q, max: 600, report: 100ms, ttl: 3s, password_file: %s}
`, rd.URL(), pw))
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.start(0, "m0", cfg, "joined the fleet"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("member log:\n%s", lab.logOf(0))
		}
	})
	reports := func(result string) float64 {
		return gauge(t, lab, 0, fmt.Sprintf("tierlimit_fleet_reports_total{result=%s}", result))
	}
	errs := reports("error")
	rd.CLI(t, 0, "CONFIG", "SET", "requirepass", "second-one")
	rd.CLI(t, 0, "--no-auth-warning", "-a", "second-one", "CLIENT", "KILL", "TYPE", "normal")
	if _, ok := within(5*time.Second, func() bool { return reports("error") > max(errs, 0)+2 }); !ok {
		t.Fatalf("no report refused after the store's password changed")
	}
	if _, err := lab.writePolicy("fleet.secret", "second-one\n"); err != nil {
		t.Fatal(err)
	}
	// No SIGHUP: the next connection reads the file.
	ok0 := reports("ok")
	if d, ok := within(5*time.Second, func() bool { return reports("ok") > ok0+2 }); !ok {
		t.Fatalf("no report ok within 5s of the file's new password, with no SIGHUP")
	} else {
		t.Logf("reports ok again %v after the file changed, with no SIGHUP", d)
	}
	if v := gauge(t, lab, 0, "tierlimit_fleet_auth_failed"); v != 0 {
		t.Errorf("tierlimit_fleet_auth_failed %v once the file has the password, want 0", v)
	}
	if err := lab.signal(0, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	ok0 = reports("ok")
	if _, ok := within(5*time.Second, func() bool { return reports("ok") > ok0+2 }); !ok {
		t.Fatalf("no report ok within 5s of a SIGHUP")
	}
	if v := gauge(t, lab, 0, "tierlimit_fleet_fallback"); v != 0 {
		t.Errorf("tierlimit_fleet_fallback %v after the reload, want 0", v)
	}
	if log := lab.logOf(0); strings.Contains(log, "second-one") || strings.Contains(log, "first-one") {
		t.Errorf("the secret is in the log")
	}
}

// labOpts is how startFleetLab builds a lab.
type labOpts struct {
	pinned bool                 // the members pin under a bpffs directory of the test's
	redis  testenv.RedisOptions // the store's options; its namespace and address are the lab's
}

// startFleetLab makes a lab of n members named prefix (newFleetLab), checks
// for leftovers, starts the store in its namespace and removes both when t
// ends; members' logs are logged when t failed. With o.pinned the members
// pin under a fresh directory of /sys/fs/bpf (the test skips without one).
func startFleetLab(t *testing.T, prefix, bin string, n int, o labOpts) (*fleetLab, *testenv.Redis) {
	t.Helper()
	lab, err := newFleetLab(prefix, bin, n)
	if err != nil {
		t.Fatal(err)
	}
	leftovers(t, lab.net.Names)
	if o.pinned {
		if lab.pinRoot, err = os.MkdirTemp("/sys/fs/bpf", prefix+"-"); err != nil {
			lab.Close()
			t.Skipf("no bpffs at /sys/fs/bpf to pin in: %v", err)
		}
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Error(err)
		}
	})
	o.redis.NetNS, o.redis.Addr = lab.net.Store, lab.net.StoreAddr
	rd := testenv.StartRedis(t, o.redis)
	t.Cleanup(func() {
		if t.Failed() {
			for i := range lab.members {
				t.Logf("member %d log:\n%s", i, lab.logOf(i))
			}
		}
	})
	return lab, rd
}
