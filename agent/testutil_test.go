package agent_test

import (
	"context"
	"fmt"
	"math"
	"net/http/httptest"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// smallPolicy is the acceptance tests' policy: max 2000 selected packets
// per 1 s window, the seed's tiers (T = 1400, 1600, 2000), UDP 514 only,
// under the ordinal shape whose windows these tests count exactly.
const smallPolicy = `mode: enforce
shape: ordinal
window: 1s
max: %d
tiers:
  - {at: 70%%, drop: 20%%}
  - {at: 80%%, drop: 50%%}
  - {at: 100%%, drop: 100%%}
select:
  - {proto: udp, ports: [514]}
`

func policy(t *testing.T, max int) tiers.Policy {
	t.Helper()
	p, err := tiers.ParseYAML(fmt.Appendf(nil, smallPolicy, max))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newPair makes a netns pair with a veth for t. Its first cleanup, which
// runs last, checks that nothing of it is left: neither namespace in `ip
// netns list`, neither veth end in the host's `ip -o link show type veth`.
func newPair(t *testing.T) *testenv.Pair {
	t.Helper()
	var p *testenv.Pair
	t.Cleanup(func() {
		if p == nil {
			return
		}
		out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
		for _, ns := range []string{p.Coll.Name, p.Send.Name} {
			if strings.Contains(string(out), ns) {
				t.Errorf("namespace %s left behind: %s", ns, out)
			}
		}
		out, _ = exec.Command("ip", "-o", "link", "show", "type", "veth").CombinedOutput()
		for _, l := range []string{p.CollIf, p.SendIf} {
			if strings.Contains(string(out), l) {
				t.Errorf("veth %s left behind: %s", l, out)
			}
		}
	})
	p = testenv.NewPair(t)
	return p
}

// newAgent runs agent.New for the pair's collector veth inside its
// namespace (New resolves and attaches by ifindex in the caller's one).
// cfg.Interfaces defaults to the collector veth.
func newAgent(p *testenv.Pair, cfg agent.Config, pol tiers.Policy) (a *agent.Agent, err error) {
	if cfg.Interfaces == nil {
		cfg.Interfaces = []string{p.CollIf}
	}
	err = p.Coll.Do(func() error {
		a, err = agent.New(cfg, pol)
		return err
	})
	return a, err
}

// startAgent starts an unpinned agent in mode on the collector veth and
// closes it in Cleanup.
func startAgent(t *testing.T, p *testenv.Pair, mode attach.XDPMode, pol tiers.Policy) *agent.Agent {
	t.Helper()
	a, err := newAgent(p, agent.Config{XDPMode: mode}, pol)
	if err != nil {
		t.Fatalf("agent.New on %s (%s): %v", p.CollIf, mode, err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("close agent: %v", err)
		}
	})
	return a
}

// metrics is one gather of the agent's collector: values by name and by
// labels rendered as `name{k="v",...}` in label-name order.
type metrics map[string]float64

// gather registers the agent's collector in a pedantic registry (which
// checks descriptors, help and label consistency) and gathers it.
func gather(t *testing.T, a *agent.Agent) metrics {
	t.Helper()
	return gatherFrom(t, a.Collector())
}

// gatherFrom gathers collector c in a pedantic registry.
func gatherFrom(t *testing.T, c prometheus.Collector) metrics {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatalf("register collector: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	m := metrics{}
	for _, mf := range mfs {
		for _, x := range mf.GetMetric() {
			var ls []string
			for _, lp := range x.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			sort.Strings(ls)
			key := mf.GetName()
			if len(ls) > 0 {
				key += "{" + strings.Join(ls, ",") + "}"
			}
			v := math.NaN()
			switch {
			case x.GetCounter() != nil:
				v = x.GetCounter().GetValue()
			case x.GetGauge() != nil:
				v = x.GetGauge().GetValue()
			}
			m[key] = v
		}
	}
	return m
}

// sum adds the series of name whose labels include every one of match
// (each `k="v"`).
func (m metrics) sum(name string, match ...string) float64 {
	var s float64
	for k, v := range m {
		base, labels, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		ok := true
		for _, want := range match {
			if !strings.Contains(","+strings.TrimSuffix(labels, "}")+",", ","+want+",") {
				ok = false
			}
		}
		if ok {
			s += v
		}
	}
	return s
}

// scrape GETs path from the agent's Handler, as Prometheus would.
func scrape(t *testing.T, a *agent.Agent, path string) (int, string) {
	t.Helper()
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	status, body, err := testenv.Get(nil, srv.URL+path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return status, string(body)
}

// within checks got against the model's expectation for offered packets:
// |got - E| <= 5σ + slack. It returns the bound for the log.
func within(t *testing.T, what string, got int, e tiers.Expectation, slack float64) float64 {
	t.Helper()
	bound := 5*math.Sqrt(e.Variance) + slack
	if d := math.Abs(float64(got) - e.Passed); d > bound {
		t.Errorf("%s: passed %d of %d offered, model expects %.1f ± %.1f (5σ, σ = %.2f, slack %.0f): off by %.1f",
			what, got, e.Offered, e.Passed, bound, math.Sqrt(e.Variance), slack, d)
	}
	return bound
}

// ping runs ping from ns and fails t unless every reply came back.
func ping(t *testing.T, ns *testenv.NS, dst string, count int, interval string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := ns.Command(ctx, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-i", interval, "-W", "2", dst).CombinedOutput()
	if err != nil {
		t.Errorf("ping %s from %s: %v\n%s", dst, ns.Name, err, out)
	}
	if want := fmt.Sprintf("%d packets transmitted, %d received", count, count); !strings.Contains(string(out), want) {
		t.Errorf("ping %s: want %q:\n%s", dst, want, out)
	}
	return string(out)
}
