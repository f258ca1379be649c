package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

func TestCheckAuto(t *testing.T) {
	path := writeFile(t, "auto.yaml", "max: auto\nauto:\n  start: 20000\n  floor: 500\n  ceiling: 90000\n")
	code, out, errs := runCmd(t, "check", "--config", path)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{
		"auto: starts at 20000, moves within [500, 90000]",
		"max × max(β, 1 − D/P)", "not below 500", "β = 0.7 after a window that dropped over 30%, else 0.9",
		"2 windows in a row without socket drops while shedding", "max + 200 (start/100)", "up to 3200; not above 90000",
		"no change while nothing is shed", "keeps the learnt max",
		"[1, 14000)", // the tables are at start
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("\n%s", out)

	path = writeFile(t, "auto-netns.yaml", "max: auto\nauto:\n  start: 20000\n  netns: /run/netns/collector\n")
	if code, out, errs := runCmd(t, "check", "--config", path); code != 0 || !regexp.MustCompile(`auto netns +/run/netns/collector: the signal is read in that network namespace`).MatchString(out) {
		t.Errorf("auto.netns: exit %d, stderr %q, want it printed:\n%s", code, errs, out)
	}
	if strings.Contains(out, "auto netns") {
		t.Errorf("auto netns printed without auto.netns:\n%s", out)
	}

	for _, c := range []struct{ name, src, want string }{
		{"netns relative", "max: auto\nauto:\n  netns: run/netns/collector\n", `line 3: auto.netns: "run/netns/collector": bad auto settings: want an absolute path`},
		{"floor over start", "max: auto\nauto:\n  start: 100\n  floor: 200\n", `line 4: auto.floor: "200": bad auto settings: floor must be at most start (100)`},
		{"properties", "limiter.max=auto\n", `line 1: limiter.max: "auto": bad auto settings`},
	} {
		name := "p.yaml"
		if c.name == "properties" {
			name = "p.properties"
		}
		code, _, errs := runCmd(t, "check", "--config", writeFile(t, name, c.src))
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stderr %q, want 2 and %q", c.name, code, errs, c.want)
		}
	}
}

// TestRunAutoMax runs `tierlimit run` with max: auto: it starts the
// controller on the namespace's socket drops, says which signal it reads,
// exports the adaptive-max metrics, and a file change that keeps the auto
// block keeps the max.
func TestRunAutoMax(t *testing.T) {
	testenv.Require(t)
	p := runPair(t)
	cfg := writeFile(t, "auto.yaml", "max: auto\nauto: {start: 3000, floor: 100, ceiling: 9000}\nselect: [{proto: udp, ports: [514]}]\n")
	r, addr := startCLI(t, p.Coll, "run", "--iface", p.CollIf, "--config", cfg, "--no-pin", "--metrics-addr", "127.0.0.1:0")
	if !strings.Contains(r.log.String(), "signal=sock_diag") || !strings.Contains(r.log.String(), "ports=udp/514") {
		t.Errorf("no log of the drop signal:\n%s", r.log)
	}
	code, body, err := testenv.Get(p.Coll, "http://"+addr+"/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	for _, want := range []string{
		`tierlimit_auto_max_adjustments_total{direction="down"} 0`,
		`tierlimit_auto_max_adjustments_total{direction="up"} 0`,
		"tierlimit_collector_socket_drops_total 0",
		"tierlimit_policy_max_packets 3000",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := os.WriteFile(cfg, []byte("max: auto\nauto: {start: 3000, floor: 100, ceiling: 9000}\nselect: [{proto: udp, ports: [514]}]\nwindow: 2s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.log.String(), "reload keeps the learnt max") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload keeping the learnt max:\n%s", r.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("run: %v\n%s", err, r.log)
	}
}

// TestRunAutoNetNS runs `tierlimit run` with auto.netns naming another
// namespace, where the collector's socket is: the log says the signal is
// read there. One that names a path that is no network namespace, or none,
// refuses to start with exit 2, before anything is attached.
func TestRunAutoNetNS(t *testing.T) {
	testenv.Require(t)
	p := runPair(t)
	testenv.NewReceiver(t, p.Send, netip.AddrPortFrom(p.SendAddr, 514))
	auto := "max: auto\nauto: {start: 3000, netns: %s}\nselect: [{proto: udp, ports: [514]}]\n"
	cfg := writeFile(t, "auto.yaml", fmt.Sprintf(auto, p.Send.Path))
	r, _ := startCLI(t, p.Coll, "run", "--iface", p.CollIf, "--config", cfg, "--no-pin", "--metrics-addr", "127.0.0.1:0")
	if !strings.Contains(r.log.String(), "signal=sock_diag netns="+p.Send.Path) {
		t.Errorf("no log of the signal read in %s:\n%s", p.Send.Path, r.log)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("run: %v\n%s", err, r.log)
	}

	for _, path := range []string{"/run/netns/tltest-none", "/proc/self/ns/mnt"} {
		cfg := writeFile(t, "auto.yaml", fmt.Sprintf(auto, path))
		code, _, errs := runCmd(t, "run", "--iface", "tlnone0", "--config", cfg, "--no-pin")
		if code != 2 || !strings.Contains(errs, `auto.netns "`+path+`": cannot read the collector socket drops in the network namespace`) ||
			strings.Contains(errs, "tlnone0") {
			t.Errorf("auto.netns %s: exit %d, stderr %q; want 2, the signal refused before the interface is looked up", path, code, errs)
		}
	}
}

// fakeStarter is an autoStarter that refuses, counting its calls.
type fakeStarter struct{ calls int }

func (f *fakeStarter) StartAutoMax(context.Context, tiers.Policy, automax.DropSource) (*automax.Controller, error) {
	f.calls++
	return nil, errors.New("refused")
}

// fakeSource is a DropSource that only records its Close.
type fakeSource struct{ closed int }

func (*fakeSource) Read([]tiers.PortRange) (automax.DropSample, error) {
	return automax.DropSample{}, nil
}
func (*fakeSource) Signal() string { return automax.SignalSNMP }
func (s *fakeSource) Close() error { s.closed++; return nil }

// TestStartAutoMaxRefused checks that startAutoMax starts nothing without a
// signal, and that a controller that does not start has its signal closed
// and the error logged.
func TestStartAutoMaxRefused(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	a := &fakeStarter{}
	startAutoMax(context.Background(), log, a, tiers.Default(), nil)
	if a.calls != 0 {
		t.Errorf("no signal: StartAutoMax called %d times, want none", a.calls)
	}
	src := &fakeSource{}
	startAutoMax(context.Background(), log, a, tiers.Default(), src)
	if a.calls != 1 || src.closed != 1 {
		t.Errorf("refused: StartAutoMax called %d times, the signal closed %d times; want 1 and 1", a.calls, src.closed)
	}
	if !strings.Contains(logs.String(), "adaptive max") || !strings.Contains(logs.String(), "refused") {
		t.Errorf("refused: the log does not say so:\n%s", logs.String())
	}
}
