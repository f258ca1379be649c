package fleet_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestFleetMetrics: the collector registers on a pedantic registry, passes
// the linter, and says what the controller sees: two members, the
// other's sum, the fleet's offered load, the store up, no fallback, and
// every result of fleet_reports_total present from the start.
func TestFleetMetrics(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	a := join(t, testConfig(r.URL(), "m", "a"), 250)
	b := join(t, testConfig(r.URL(), "m", "b"), 750)
	shares(t, 20, a, b)

	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(a.c); err != nil {
		t.Fatalf("register: %v", err)
	}
	want := `
# HELP tierlimit_fleet_fallback 1 while the member applies its fallback because the store has not answered for ttl.
# TYPE tierlimit_fleet_fallback gauge
tierlimit_fleet_fallback 0
# HELP tierlimit_fleet_members Members of the fleet, this one included, as the store last returned them (docs/design.md §12).
# TYPE tierlimit_fleet_members gauge
tierlimit_fleet_members 2
# HELP tierlimit_fleet_offered The fleet's offered load per window at the last report: this member's estimate plus the others' sum.
# TYPE tierlimit_fleet_offered gauge
tierlimit_fleet_offered 1000
# HELP tierlimit_fleet_others The other members' reported estimates, summed: what the program adds to its own (0 in fallback).
# TYPE tierlimit_fleet_others gauge
tierlimit_fleet_others 750
# HELP tierlimit_fleet_store_up 1 when the last report reached the store in time, else 0.
# TYPE tierlimit_fleet_store_up gauge
tierlimit_fleet_store_up 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tierlimit_fleet_fallback", "tierlimit_fleet_members", "tierlimit_fleet_offered",
		"tierlimit_fleet_others", "tierlimit_fleet_store_up"); err != nil {
		t.Error(err)
	}
	for _, name := range []string{"tierlimit_fleet_auth_failed", "tierlimit_fleet_store_dials_total"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 1 {
			t.Errorf("%s has %d series (%v); want 1", name, n, err)
		}
	}
	if got := metric(t, a.c, "tierlimit_fleet_auth_failed"); got != 0 {
		t.Errorf("fleet_auth_failed %v for a member the store let in; want 0", got)
	}
	if got := metric(t, a.c, "tierlimit_fleet_store_dials_total"); got < 1 {
		t.Errorf("fleet_store_dials_total %v after joining; want >= 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "tierlimit_fleet_reports_total"); err != nil || n != 3 {
		t.Errorf("fleet_reports_total has %d series (%v); want 3: ok, error, slow", n, err)
	}
	if got := metric(t, a.c, "tierlimit_fleet_reports_total", `result="ok"`); got < 1 {
		t.Errorf("%v reports ok; want >= 1", got)
	}
	problems, err := testutil.CollectAndLint(a.c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}
