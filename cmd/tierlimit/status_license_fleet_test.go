package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// spendOnce is a license ledger that hands over its bytes until the
// store acknowledges them.
type spendOnce struct {
	mu    sync.Mutex
	bytes uint64
	total uint64 // the fleet's total as last told
}

func (s *spendOnce) TakeSpend() (uint64, func(bool)) {
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

func (s *spendOnce) FleetSpent(_ time.Time, total uint64, _ int) {
	s.mu.Lock()
	s.total = total
	s.mu.Unlock()
}

func (*spendOnce) Unreachable() {}

// TestStatusLicenseFleet: status --license --config F of a policy with
// fleet: and license: reads the fleet's day from the store, with no
// agent: the total against per_day and each member's part, as text and
// JSON; a policy without fleet: exits 2 saying what it needs.
func TestStatusLicenseFleet(t *testing.T) {
	rd := testenv.StartRedis(t, testenv.RedisOptions{})
	cfgPath := writeFile(t, "policy.yaml", `count: bytes
shape: smooth
max: 1MB
select: [{proto: udp, ports: [514]}]
license: {per_day: 500GB, zone: America/Chicago}
fleet:
  name: tllic
  store: `+rd.URL()+`
  max: 1MB
`)
	p, err := tiers.LoadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var ls []*spendOnce
	for i, m := range []string{"alpha", "beta"} {
		l := &spendOnce{bytes: uint64(3000 * (i + 1))}
		ls = append(ls, l)
		cfg := agent.FleetConfig(p.Fleet, m)
		cfg.License = &fleet.License{Ledger: l, Day: agent.LicenseDay(p.License)}
		c, err := fleet.Start(cfg, fixedEstimate(1), fixedEstimate(1), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, l := range ls {
		for {
			l.mu.Lock()
			done := l.total == 9000
			l.mu.Unlock()
			if done || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"status", "--license", "--config", cfgPath}, &out, io.Discard); err != nil {
		t.Fatalf("status --license --config: %v", err)
	}
	t.Logf("status --license --config:\n%s", out.String())
	day := p.License.DayOf(time.Now())
	for _, want := range []string{"9000 of 500000000000 bytes", "the fleet tllic's total", day.Start.Format("2006-01-02 15:04 MST"),
		"beta", "6000", "66.7%", "alpha", "3000"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status --license lacks %q", want)
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"status", "--license", "--json", "--config", cfgPath}, &out, io.Discard); err != nil {
		t.Fatalf("status --license --json --config: %v", err)
	}
	var js licenseFleetJSON
	if err := json.Unmarshal(out.Bytes(), &js); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if js.Spent != 9000 || js.PerDay != 500e9 || len(js.Members) != 2 || js.Members[0].Name != "beta" || !js.DayStart.Equal(day.Start) {
		t.Errorf("status --license --json: %+v", js)
	}
	noFleet := writeFile(t, "nofleet.yaml", "count: bytes\nmax: 1MB\nlicense: {per_day: 500GB}\n")
	if code, _, errs := runCmd(t, "status", "--license", "--config", noFleet); code != 2 || !strings.Contains(errs, "fleet: and license:") {
		t.Errorf("a policy without fleet: exit %d, %q; want 2 naming what it needs", code, errs)
	}
}
