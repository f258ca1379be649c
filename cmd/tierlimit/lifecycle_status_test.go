package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// Modes and offline status: dry-run and off count without dropping, and
// status, status --json and detach read the pinned state with no agent.

// TestDryRunAndOff offers 3× max per window under dry-run, then off:
// nothing is dropped, dry-run's would_drop is within 5σ of what enforce
// would drop (tiers.Expected), and off still counts.
func TestDryRunAndOff(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	cfg := filepath.Join(t.TempDir(), "tierlimit.yaml")
	// The ordinal shape: would_drop is compared with the seed's exact
	// per-window expectation.
	const windowYAML = "mode: %s\nwindow: 200ms\nmax: 200\nshape: ordinal\nselect: [{proto: udp, ports: [514]}]\n"
	writeConfig(t, cfg, fmt.Sprintf(windowYAML, "dry-run"))
	recv := testenv.NewReceiver(t, p.Coll, netip.AddrPortFrom(p.CollAddr, 514))
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--no-pin")
	s := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	bursts := testenv.Bursts{Count: 5, PerBurst: 600, Spread: 120 * time.Millisecond, Budget: 170 * time.Millisecond, Period: 260 * time.Millisecond}
	pol, err := tiers.ParseYAML(fmt.Appendf(nil, windowYAML, "enforce"))
	if err != nil {
		t.Fatal(err)
	}

	offer := func() (sent int, expDrop, variance float64) {
		t.Helper()
		per, err := s.SendBursts(context.Background(), bursts)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range per {
			e, err := tiers.Expected(pol, uint64(n))
			if err != nil {
				t.Fatal(err)
			}
			sent += n
			expDrop += e.Dropped
			variance += e.Variance
		}
		recv.WaitQuiet(200*time.Millisecond, 5*time.Second)
		return sent, expDrop, variance
	}

	sent, expDrop, variance := offer()
	m := scrape(t, p.Coll)
	_, received := recv.Counts()
	wouldDrop := sum(m, "tierlimit_selected_packets_total", "verdict=would_drop")
	if received != sent || sum(m, "tierlimit_selected_packets_total", "verdict=drop") != 0 {
		t.Fatalf("dry-run: received %d of %d sent, dropped %v", received, sent, sum(m, "tierlimit_selected_packets_total", "verdict=drop"))
	}
	if bound := 5 * math.Sqrt(variance); math.Abs(wouldDrop-expDrop) > bound {
		t.Fatalf("dry-run: would_drop %v, enforce would drop %.1f ± %.1f (5σ)", wouldDrop, expDrop, bound)
	}
	t.Logf("dry-run: %d sent, all received; would_drop %v (enforce expects %.1f ± %.1f)", sent, wouldDrop, expDrop, 5*math.Sqrt(variance))

	writeConfig(t, cfg, fmt.Sprintf(windowYAML, "off"))
	if !a.waitLog("mode=off", 5*time.Second) {
		t.Fatalf("no reload to off:\n%s", a.log)
	}
	before := scrape(t, p.Coll)
	sent2, _, _ := offer()
	after := scrape(t, p.Coll)
	_, received2 := recv.Counts()
	if received2-received != sent2 {
		t.Fatalf("off: received %d of %d", received2-received, sent2)
	}
	d := func(v string) float64 {
		return sum(after, "tierlimit_selected_packets_total", v) - sum(before, "tierlimit_selected_packets_total", v)
	}
	if d("verdict=pass") != float64(sent2) || d("verdict=drop") != 0 || d("verdict=would_drop") != 0 {
		t.Fatalf("off: pass +%v drop +%v would_drop +%v, want +%d, 0, 0", d("verdict=pass"), d("verdict=drop"), d("verdict=would_drop"), sent2)
	}
}

// TestStatusMatchesMetricsAndDetach: after traffic, `status` and `status
// --json` (no agent running) show what /metrics showed; `detach` leaves no
// pinned file and no XDP program.
func TestStatusMatchesMetricsAndDetach(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, "window: 1h\nmax: 100\nselect: [{proto: udp, ports: [514]}]\n")
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--pin-path", pin)
	s := testenv.NewSender(t, p.Send, netip.AddrPortFrom(p.CollAddr, 514))
	if _, err := s.Pace(context.Background(), 300, 100*time.Millisecond, 5*time.Second, func(i int) []byte { return testenv.SyslogMessage(0, i) }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	m := scrape(t, p.Coll)
	a.stop(t, syscall.SIGTERM)

	run := func(args ...string) string {
		t.Helper()
		out, err := p.Coll.Command(context.Background(), cli(t), append(args, "--pin-path", pin)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tierlimit %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var st struct {
		Interfaces []struct{ Iface, Mode string }
		Policy     struct {
			MaxPackets uint64 `json:"max_packets"`
		}
		Window struct {
			Packets uint64
			Tier    int
		}
		Selected []struct {
			Tier    int
			Verdict string
			Packets uint64
		}
		Unselected uint64 `json:"unselected_packets"`
	}
	if err := json.Unmarshal([]byte(run("status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Interfaces) != 1 || st.Interfaces[0].Iface != p.CollIf || st.Interfaces[0].Mode != "native" {
		t.Errorf("status interfaces %+v", st.Interfaces)
	}
	if st.Policy.MaxPackets != 100 || float64(st.Window.Packets) != m["tierlimit_window_packets"] || float64(st.Window.Tier) != m["tierlimit_current_tier"] {
		t.Errorf("status policy/window %+v %+v, metrics window %v tier %v", st.Policy, st.Window, m["tierlimit_window_packets"], m["tierlimit_current_tier"])
	}
	// The pinned limiter keeps counting after the scrape: the veth's own
	// link-local traffic (IPv6 router solicitations, MLD reports) may add a
	// few unselected packets before status reads the maps; never fewer.
	if u, mu := float64(st.Unselected), m["tierlimit_unselected_packets_total"]; u < mu || u > mu+10 {
		t.Errorf("status unselected %d, metrics %v (status may only be a few packets later)", st.Unselected, mu)
	}
	var total uint64
	for _, s := range st.Selected {
		key := fmt.Sprintf("tierlimit_selected_packets_total{tier=%d,verdict=%s}", s.Tier, s.Verdict)
		if float64(s.Packets) != m[key] {
			t.Errorf("status %s = %d, metrics %v", key, s.Packets, m[key])
		}
		total += s.Packets
	}
	if total != 300 {
		t.Errorf("status counts %d selected packets, want the 300 sent", total)
	}
	text := run("status")
	for _, want := range []string{p.CollIf, "native XDP", "max 100 packets", fmt.Sprintf("n=%d", st.Window.Packets)} {
		if !strings.Contains(text, want) {
			t.Errorf("status text lacks %q:\n%s", want, text)
		}
	}

	run("detach", "--iface", p.CollIf)
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("pins left after detach: %v", err)
	}
	out, err := p.Coll.Command(context.Background(), "ip", "link", "show", p.CollIf).CombinedOutput()
	if err != nil || strings.Contains(string(out), "xdp") {
		t.Errorf("XDP still on %s after detach: %s %v", p.CollIf, out, err)
	}
}

// TestReloadOnSymlinkSwap: a config that is a symlink swapped to a new
// target (as Kubernetes updates a mounted ConfigMap) reloads once, and an
// event that leaves the content unchanged does not reload.
func TestReloadOnSymlinkSwap(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	dir := t.TempDir()
	for name, body := range map[string]string{"a.yaml": strictYAML, "b.yaml": lenientYAML} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "tierlimit.yaml")
	if err := os.Symlink("a.yaml", cfg); err != nil {
		t.Fatal(err)
	}
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--no-pin")
	// Unrelated churn in the directory: no reload.
	if err := os.WriteFile(filepath.Join(dir, "unrelated"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if strings.Contains(a.log.String(), "msg=reloaded") {
		t.Fatalf("reloaded on an unrelated file:\n%s", a.log)
	}
	// Swap the symlink atomically, as kubelet does.
	tmp := filepath.Join(dir, "tierlimit.yaml.tmp")
	if err := os.Symlink("b.yaml", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, cfg); err != nil {
		t.Fatal(err)
	}
	if !a.waitLog("max=1000000", 5*time.Second) {
		t.Fatalf("no reload after the symlink swap:\n%s", a.log)
	}
	if n := strings.Count(a.log.String(), "msg=reloaded"); n != 1 {
		t.Fatalf("%d reloads after one swap:\n%s", n, a.log)
	}
	if got := sum(scrape(t, p.Coll), "tierlimit_policy_max_packets"); got != 1_000_000 {
		t.Fatalf("policy_max_packets %v after the swap, want 1000000", got)
	}
}
