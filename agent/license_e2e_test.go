package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/license"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// The license day compressed for the test (docs/design.md §13): a day of
// 24 h runs in 24 s (a clock 3,600 times faster than the real one), in
// windows of 200 ms (the smooth shape's least).
const (
	licDayReal = 24 * time.Second
	licFactor  = 3600
	licWindow  = 200 * time.Millisecond
	licSize    = 256  // payload bytes of every datagram
	licRate    = 1000 // datagrams/s offered: 2 × the day's average
	licProtect = 100  // every licProtect-th datagram is protected (severity 2)
	// licPerDay is the day's volume: half of what licRate offers in the day.
	licPerDay = licRate / 2 * licSize * int(licDayReal/time.Second)
)

func licensePolicy(t *testing.T, events string) tiers.Policy {
	t.Helper()
	p, err := tiers.ParseYAML(fmt.Appendf(nil, `count: bytes
window: %s
max: 10MB
select: [{proto: udp, ports: [514]}]
severity: {protect: [2]}
license: {per_day: %d, zone: UTC, warn_at: 80%%}
events: {syslog: %q}
`, licWindow, licPerDay, events))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// licMessage is datagram i: licSize bytes of RFC 3164 syslog, every
// licProtect-th at severity 2 (<10>), the rest at 6 (<14>); printable, no
// line feed, so that rsyslog writes it as it came.
func licMessage(i int) []byte {
	pri := 14
	if i%licProtect == 0 {
		pri = 10
	}
	m := fmt.Appendf(nil, "<%d>Jun  1 00:00:00 sender app: license test datagram %09d ", pri, i)
	return append(m, bytes.Repeat([]byte("x"), licSize-len(m))...)
}

// TestLicenseDayE2E runs a compressed license day through the real
// program on a veth, flooded at 2 × the day's average rate with 1 %
// protected, into rsyslog writing each datagram's payload to a file
// (StartRsyslogRaw: the payload and a line feed; the rule: the file's
// bytes less its lines are the payload bytes received). At mid-day the
// agent is closed and a new one adopts the pinned program and takes up
// the day's spend from the state file while the flood goes on. It checks:
//   - the spend survives the restart (the new guard's is at least the
//     old one's at its stop, the passes meanwhile added from the pinned
//     counter);
//   - the day ends within 1 % of per_day, on the program's passed-bytes
//     counter (tierlimit_passed_bytes_total), and the bytes rsyslog wrote
//     are within 1 % of it;
//   - every protected datagram sent reached rsyslog;
//   - the warning at warn_at went to events.syslog (license-warn) and is
//     counted, and the license's metrics are served.
//
// The flood is judged on what was offered: it must offer at least 1.5 ×
// per_day, else the test says the pacer fell behind.
func TestLicenseDayE2E(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	rs := testenv.StartRsyslogRaw(t, p.Coll, netip.AddrPortFrom(p.CollAddr, 514))
	events, reports := listenReports(t)
	pol := licensePolicy(t, "udp://"+events)
	pinPath := testenv.PinPath(t, pin.LockFile)
	state := filepath.Join(t.TempDir(), "license.json")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	start := func(c license.Clock) (*agent.Agent, *license.Guard) {
		a, err := newAgent(p, agent.Config{PinPath: pinPath}, pol)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		if _, err := a.StartRecord(ctx, pol, ""); err != nil {
			t.Fatal(err)
		}
		g, err := a.StartLicense(ctx, pol, state, c)
		if err != nil {
			t.Fatal(err)
		}
		return a, g
	}
	origin := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	clock := license.NewCompressed(origin, licFactor)
	a, g := start(clock)
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")

	// The flood, the whole day, from one sender.
	tx := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	left := time.Duration(float64(origin.Add(24*time.Hour).Sub(clock.Now())) / licFactor) // real time to the day's end
	count := int(float64(licRate) * left.Seconds())
	sentc := make(chan int, 1)
	go func() {
		n, err := tx.Pace(ctx, count, left, left, licMessage)
		if err != nil {
			t.Errorf("flood: %v", err)
		}
		sentc <- n
	}()

	// Mid-day: the agent closes and a new one takes up the spend.
	time.Sleep(left / 2)
	a.Close()
	before := g.Snapshot()
	a, g = start(clock)
	after := g.Snapshot()
	t.Logf("restart at %s: spent %d before, %d after", clock.Now().Format("15:04"), before.Spent, after.Spent)
	if before.Spent == 0 || after.Spent < before.Spent || !after.DayStart.Equal(origin) {
		t.Errorf("restart: spent %d before, %d after (day %s); want it kept", before.Spent, after.Spent, after.DayStart)
	}

	time.Sleep(time.Duration(float64(origin.Add(24*time.Hour).Sub(clock.Now()))/licFactor) - 300*time.Millisecond)
	late := g.Snapshot()
	t.Logf("at %s: spent %d (%.1f%%), target %d, budget %d per window", clock.Now().Format("15:04"), late.Spent,
		100*float64(late.Spent)/float64(licPerDay), late.Target, late.Max)
	sent := <-sentc
	time.Sleep(500 * time.Millisecond) // the last datagrams through the program
	m := gather(t, a)
	lm := gatherFrom(t, g)
	passed := m.sum("tierlimit_passed_bytes_total")
	offered, perDay := float64(sent*licSize), float64(licPerDay)
	t.Logf("day: sent %d datagrams (%.0f bytes, %.2f × per_day); passed %.0f bytes of per_day %d (%+.2f%%)",
		sent, offered, offered/perDay, passed, licPerDay, 100*(passed-perDay)/perDay)
	if offered < 1.5*perDay {
		t.Fatalf("the pacer fell behind: offered %.0f bytes, under 1.5 × per_day", offered)
	}
	if d := (passed - perDay) / perDay; d < -0.01 || d > 0.01 {
		t.Errorf("the day passed %.0f bytes, %+.2f%% from per_day %d; want within 1%%", passed, 100*d, licPerDay)
	}

	// rsyslog: what it wrote, once the file stops growing.
	wrote, lines, prot := waitFile(t, rs.Out)
	got := float64(wrote - lines)
	t.Logf("rsyslog wrote %d lines, %.0f payload bytes (%+.2f%% of passed); %d protected", lines, got, 100*(got-passed)/passed, prot)
	if d := (got - passed) / passed; d < -0.01 || d > 0.01 {
		t.Errorf("rsyslog wrote %.0f payload bytes, %+.2f%% from the %.0f passed; want within 1%%", got, 100*d, passed)
	}
	if want := (sent + licProtect - 1) / licProtect; prot != want {
		t.Errorf("rsyslog got %d protected datagrams of %d sent; want all", prot, want)
	}

	if w := lm.sum("tierlimit_license_warnings_total", `level="warn"`) + float64(min(before.Warned, 1)); w != 1 { // before or after the restart, once
		t.Errorf("license warnings at warn_at: %v, want 1", w)
	}
	warned := false
	for _, r := range reports() {
		warned = warned || r.event == "license-warn"
	}
	if !warned {
		t.Error("no license-warn event reached events.syslog")
	}
	for _, name := range []string{"tierlimit_license_spent_bytes", "tierlimit_license_pace_bytes", "tierlimit_license_projected_bytes",
		"tierlimit_license_budget_bytes", "tierlimit_license_window_budget_bytes", "tierlimit_license_warn_bytes"} {
		if _, ok := lm[name]; !ok {
			t.Errorf("%s not served (the dashboard's license panel and the alerts read it)", name)
		}
	}
}

// waitFile waits until the file at path stops growing (1 s quiet, at
// most 15 s) and returns its bytes, its lines and the lines of protected
// datagrams (<10>).
func waitFile(t *testing.T, path string) (size, lines, prot int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	last := -1
	for {
		b, err := os.ReadFile(path)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if len(b) == last || time.Now().After(deadline) {
			return len(b), bytes.Count(b, []byte("\n")), strings.Count(string(b), "<10>")
		}
		last = len(b)
		time.Sleep(time.Second)
	}
}
