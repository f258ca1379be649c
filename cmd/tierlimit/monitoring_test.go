package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// The monitoring end-to-end test (issue 16): a real Prometheus server
// (Debian's package) scrapes a running agent on a veth during a flood,
// with the shipped alert rules and dashboard.

const (
	alertsFile    = "../../deploy/prometheus/alerts.yaml"
	dashboardFile = "../../deploy/grafana/tierlimit.json"
	// Prometheus listens on loopback inside the collector namespace.
	promURL = "http://127.0.0.1:9090"
)

// requirePrometheus returns the prometheus binary, or skips (fails under
// TIERLIMIT_REQUIRE_BPF=1, where CI has installed it).
func requirePrometheus(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	if os.Getenv(testenv.RequireEnv) == "1" {
		t.Fatal("prometheus not installed (apt-get install prometheus, or make deps)")
	}
	t.Skip("prometheus not installed (apt-get install prometheus, or make deps)")
	return ""
}

// testRules writes a copy of the shipped alert rules in which every `for:`
// is 1s, so that an alert fires within seconds of its expression turning
// true; the expressions are the shipped ones. It returns the copy's path
// and the alert names.
func testRules(t *testing.T, dir string) (string, []string) {
	t.Helper()
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Name  string           `yaml:"name"`
			Rules []map[string]any `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	var names []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if _, ok := r["for"]; ok {
				r["for"] = "1s"
			}
			names = append(names, fmt.Sprint(r["alert"]))
		}
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "alerts.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, names
}

// startPrometheus runs prometheus in ns with a temporary config and data
// directory: 1 s scrapes of the agent at 127.0.0.1:9713 (job tierlimit),
// 1 s rule evaluation. Cleanup stops it.
func startPrometheus(t *testing.T, ns *testenv.NS) {
	t.Helper()
	bin := requirePrometheus(t)
	dir := t.TempDir()
	rules, _ := testRules(t, dir)
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: tierlimit
    static_configs: [{targets: ["127.0.0.1:9713"]}]
`, rules)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	log := &testenv.SyncBuffer{}
	cmd := ns.Command(context.Background(), bin, "--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:9090",
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if status, _, err := testenv.Get(ns, promURL+"/-/ready"); err == nil && status == 200 {
			return
		}
		select {
		case <-done:
			t.Fatalf("prometheus exited:\n%s", log)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30s:\n%s", log)
		}
	}
}

// promGet reads a Prometheus HTTP API endpoint into data.
func promGet(ns *testenv.NS, path string, data any) error {
	status, body, err := testenv.Get(ns, promURL+path)
	if err != nil {
		return err
	}
	var resp struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("%s: HTTP %d: %v", path, status, err)
	}
	if resp.Status != "success" {
		return fmt.Errorf("%s: %s", path, resp.Error)
	}
	return json.Unmarshal(resp.Data, data)
}

// promSeries is the number of series query returns now.
func promSeries(ns *testenv.NS, query string) (int, error) {
	var data struct {
		Result []json.RawMessage `json:"result"`
	}
	err := promGet(ns, "/api/v1/query?query="+url.QueryEscape(query), &data)
	return len(data.Result), err
}

// firing returns the names of the alerts that are firing.
func firing(t *testing.T, ns *testenv.NS) map[string]bool {
	t.Helper()
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	if err := promGet(ns, "/api/v1/alerts", &data); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, a := range data.Alerts {
		if a.State == "firing" {
			out[a.Labels["alertname"]] = true
		}
	}
	return out
}

// waitFiring waits until every alert of names fires.
func waitFiring(t *testing.T, ns *testenv.NS, limit time.Duration, names ...string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		f := firing(t, ns)
		missing := []string{}
		for _, n := range names {
			if !f[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts %v not firing after %v (firing: %v)", missing, limit, f)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// dashboardQueries returns every PromQL query of the dashboard, with
// Grafana's variables replaced as Grafana would: $__rate_interval by a
// range that holds several of the test's 1 s scrapes, $instance by all
// instances, and the instance variable's label_values(m, l) by m.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			qs = append(qs, tg.Expr)
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(([^,]+),\s*\w+\)$`)
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			m := labelValues.FindStringSubmatch(fmt.Sprint(q["query"]))
			if m == nil {
				t.Fatalf("variable %s: query %v is not label_values(metric, label)", v.Name, q["query"])
			}
			qs = append(qs, m[1])
		}
	}
	r := strings.NewReplacer("$__rate_interval", "5s", "$instance", ".*")
	for i, q := range qs {
		qs[i] = r.Replace(q)
		if strings.Contains(qs[i], "$") {
			t.Fatalf("query %q: a Grafana variable the test does not replace", q)
		}
	}
	return qs
}

// TestMonitoringEndToEnd runs Prometheus against an agent shedding a
// flood: every dashboard query returns data, the shedding and drop-ratio
// alerts fire and nothing says the limiter is detached; then a bad policy
// reload fires the reload alert.
func TestMonitoringEndToEnd(t *testing.T) {
	testenv.Require(t)
	requirePrometheus(t)
	queries := dashboardQueries(t)
	p, pin, cfg := pinnedSetup(t, strictYAML)
	startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--pin-path", pin)
	startPrometheus(t, p.Coll)
	f := startFlood(t, p, 40*time.Second)

	start := time.Now()
	waitFiring(t, p.Coll, 20*time.Second, "TierlimitShedding", "TierlimitDropRatioHigh")
	t.Logf("shedding alerts firing %v after the flood started", time.Since(start).Round(time.Millisecond))
	for _, q := range queries {
		if strings.Contains(q, "tierlimit_license_") {
			continue // this policy has no license: the license's panel is TestLicenseDayE2E's (agent), on the agent's own metrics
		}
		if n, err := promSeries(p.Coll, q); err != nil || n == 0 {
			t.Errorf("dashboard query %s: %d series, %v", q, n, err)
		}
	}
	// run's Reloader tells the agent its config watch is live (issue 24).
	if n, err := promSeries(p.Coll, `tierlimit_config_watch_live{mode="watch"} == 1`); err != nil || n != 1 {
		t.Errorf("config watch gauge: %d series live, %v; want 1", n, err)
	}
	for _, n := range []string{"TierlimitInterfaceNotAttached", "TierlimitAgentDown", "TierlimitAgentAbsent", "TierlimitConfigWatchNotLive", "TierlimitReloadFailed", "TierlimitScrapeErrors", "TierlimitFleetAuthFailed", "TierlimitLicenseApproaching", "TierlimitLicenseSpent"} {
		if firing(t, p.Coll)[n] {
			t.Errorf("%s fires for a healthy agent", n)
		}
	}

	start = time.Now()
	writeConfig(t, cfg, "max: -1\n")
	waitFiring(t, p.Coll, 15*time.Second, "TierlimitReloadFailed")
	t.Logf("reload alert firing %v after the bad policy was saved", time.Since(start).Round(time.Millisecond))
	f.stop()
	if f.err != nil {
		t.Errorf("flood: %v", f.err)
	}
}
