package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

func TestParseBench(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkProgram/gate/selected-pass-2         	 4194304	        34.50 bare-ns/pkt	        66.25 ns/pkt	         1.920 x-bare
BenchmarkProgram/gate/sources-pass-2          	 4194304	         8.105 bare-ns/pkt	         5.000 floor-atomics	        35.56 floor-ns/pkt	         4.387 floor-x-bare	        51.40 ns/pkt	         6.342 x-bare	         1.446 x-floor
BenchmarkLiveFrames-2   	 4194304	         7.640 Mpps	        12.49 bare-Mpps	         0.6117 x-bare
BenchmarkLiveFramesSources/within-budget-2   	 4194304	         5.210 Mpps	        12.02 bare-Mpps	         0.4334 x-bare
PASS
`)
	rs := parseBench(out)
	if len(rs) != 4 {
		t.Fatalf("parsed %d results, want 4", len(rs))
	}
	if got := values(rs, "BenchmarkProgram/gate/selected-pass", "x-bare"); len(got) != 1 || got[0] != 1.92 {
		t.Errorf("x-bare = %v, want [1.92]", got)
	}
	if got := values(rs, "BenchmarkLiveFrames", "Mpps"); len(got) != 1 || got[0] != 7.64 {
		t.Errorf("Mpps = %v, want [7.64]", got)
	}
	for unit, want := range map[string]float64{"floor-ns/pkt": 35.56, "x-floor": 1.446, "floor-x-bare": 4.387, "floor-atomics": 5, "ns/pkt": 51.40} {
		if got := values(rs, "BenchmarkProgram/gate/sources-pass", unit); len(got) != 1 || got[0] != want {
			t.Errorf("sources-pass %s = %v, want [%v]", unit, got, want)
		}
	}
	if got := values(rs, "BenchmarkLiveFramesSources/within-budget", "x-bare"); len(got) != 1 || got[0] != 0.4334 {
		t.Errorf("within-budget x-bare = %v, want [0.4334]", got)
	}
}

// benchFixture is go test -bench output for every benchmark the report
// reads, one run each: tierlimit at ns ns/pkt on every path of
// BenchmarkProgram beside bare at 8 (floors at 12, 4 adds on the sources
// paths at 20), sources-pass at 2.5× bare.
func benchFixture() string {
	var b strings.Builder
	line := func(name, metrics string) { fmt.Fprintf(&b, "%s-2 \t 4194304\t %s\n", name, metrics) }
	for _, mode := range []string{"gate", "exact"} {
		for _, path := range programPaths {
			ns := 20.0
			if path == "sources-pass" {
				ns = 24
			}
			m := fmt.Sprintf("8.000 bare-ns/pkt\t %.3f ns/pkt\t %.4f x-bare", ns, ns/8)
			if slices.Contains(floorPaths, path) {
				adds, floor := 1.0, 12.0
				if strings.HasPrefix(path, "sources-") {
					adds, floor = 5, 20
				}
				m += fmt.Sprintf("\t %.0f floor-atomics\t %.3f floor-ns/pkt\t %.4f floor-x-bare\t %.4f x-floor", adds, floor, floor/8, ns/floor)
			}
			line("BenchmarkProgram/"+mode+"/"+path, m)
		}
	}
	line("BenchmarkBarePass", "8.000 bare-ns/pkt\t 8.100 ns/pkt\t 1.0125 x-bare")
	line("BenchmarkLiveFrames", "7.640 Mpps\t 12.49 bare-Mpps\t 0.6117 x-bare\t 12.40 touch-Mpps\t 0.9928 touch-x-bare")
	line("BenchmarkLiveFramesSources/over-budget", "9.000 Mpps\t 12.00 bare-Mpps\t 0.7500 x-bare")
	line("BenchmarkLiveFramesSources/within-budget", "6.000 Mpps\t 12.00 bare-Mpps\t 0.5000 x-bare")
	line("BenchmarkStages/selected-drop", "8.000 bare-ns\t 8.000 entry-ns\t 12.00 parsed-ns\t 14.00 judge-ns\t 18.00 policy-ns\t 20.00 window-ns\t 23.00 full-ns")
	line("BenchmarkStages/selected-pass", "8.000 bare-ns\t 8.000 entry-ns\t 12.00 parsed-ns\t 14.00 judge-ns\t 18.00 policy-ns\t 21.00 window-ns\t 24.00 full-ns")
	line("BenchmarkStages/sources-pass", "8.000 bare-ns\t 8.000 entry-ns\t 12.00 parsed-ns\t 14.00 judge-ns\t 18.00 policy-ns\t 20.00 group-ns\t 30.00 sketch-ns\t 36.00 window-ns\t 39.00 full-ns")
	line("BenchmarkStages/sources-over", "8.000 bare-ns\t 8.500 entry-ns\t 12.00 parsed-ns\t 15.00 judge-ns\t 19.00 policy-ns\t 21.00 group-ns\t 25.00 sketch-ns\t 35.00 full-ns")
	for _, path := range []string{"selected-drop", "sources-over"} {
		line("BenchmarkRecord/"+path, "10.00 bare-ns/pkt\t 30.00 off-ns/pkt\t 31.50 on-ns/pkt\t 30.60 share-ns/pkt\t 1.020 share-x-off\t 1.050 x-off")
	}
	line("BenchmarkLiveFramesRecord", "19.00 Mpps\t 40.00 bare-Mpps\t 20.00 off-Mpps\t 18.00 share-Mpps\t 0.9000 share-x-off\t 0.9500 x-off")
	line("BenchmarkRecordTransport", "25.00 off-ns/pkt\t 72.00 ring-ns/sample\t 1800 ring-read-ns/sample\t 5200 perf-ns/sample\t 1900 perf-read-ns/sample\t 72.22 perf-x-ring\t 1.056 perf-read-x-ring\t 200.0 perf-batch-ns/sample\t 1850 perf-batch-read-ns/sample\t 2.778 perf-batch-x-ring\t 1.028 perf-batch-read-x-ring")
	for _, path := range []string{"selected-pass", "selected-drop", "unselected", "sources-over"} {
		line("BenchmarkScaling/"+path, "10.00 1cpu-Mpps\t 18.00 2cpu-Mpps\t 1.800 x-scaling\t 1.900 bare-x-scaling\t 0.9474 x-vs-bare\t 5.000 contention-%\t 3.000 line-ns")
	}
	return b.String()
}

// TestReportBenchRows renders the targets and figures 1-3 from a fixture
// of every benchmark: every row has its figures (no n/a), the floors and
// issue 12's rows are there with the right values, and the -test.bench
// pattern of the suite selects every benchmark the report reads.
func TestReportBenchRows(t *testing.T) {
	r := &report{opts: suiteOpts{benchtime: "4194304x"}, bench: parseBench([]byte(benchFixture()))}
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	r.targets(p)
	r.fig1(p)
	r.fig2(p)
	r.fig3(p)
	out := b.String()
	if strings.Contains(out, "n/a") {
		t.Errorf("a row lacks its figures:\n%s", out)
	}
	if strings.Contains(out, "%!") {
		t.Errorf("a format verb lacks its argument:\n%s", out)
	}
	for _, want := range []string{
		"| gate/selected-pass-severity | 20.0 | 8.0 | 2.50× |",
		"| exact/sources-over | 20.0 | 8.0 | 2.50× |",
		"| gate/sources-pass | 24.0 | 8.0 | 3.00× |",
		"| gate/sources-pass-ipv6 | 20.0 | 8.0 | 2.50× |",
		// floor: (12-8)/(20-8) = 33%; sources-pass (20-8)/(24-8) = 75%.
		"| gate/selected-pass | 1 | 12.0 | 1.50× | 1.67× | 8.0 | 33% |",
		"| exact/sources-pass | 5 | 20.0 | 2.50× | 1.20× | 4.0 | 75% |",
		"| over-budget | 9.00 | 12.00 | 0.75× |",
		"| within-budget | 6.00 | 12.00 | 0.50× |",
		"| test_run, selected path with sources on ≤ 2.6× bare XDP_DROP (issue 12; sources-pass) | 3.00× (its floor of 5 atomic adds: 2.50×) | **not met** |",
		"| test_run, selected path with sources absent ≤ 2.0× bare XDP_DROP (issue 12; selected-pass) | 2.50× (its floor of 1 atomic add: 1.50×) | **not met** |",
		// Stages: what each adds to the one before; — where not reached.
		"| selected-drop | 8.0 | 0.0 | 4.0 | 2.0 | 4.0 | — | — | 2.0 | 3.0 | 23.0 | 2.88× |",
		"| sources-over | 8.0 | 0.5 | 3.5 | 3.0 | 4.0 | 2.0 | 4.0 | — | 10.0 | 35.0 | 4.38× |",
		"| live frames with sources on (issue 12) | over budget 0.75× bare (9.00 Mpps), within budget 0.50× (6.00 Mpps) | reported |",
		"| test_run, drop path with the shed record on at 100/s ≤ 1.1× off (issue 23) | 1.05× (over budget 1.05×; share below 1 1.02×) | **met** |",
		"| live frames, drop path with the shed record on ≥ 0.9× off Mpps (issue 23) | 0.95× (share below 1 0.90×) | **met** |",
		"| live frames, Mpps | 19.00 | 18.00 | 20.00 | 0.95× | 0.90× |",
		"| perf event array, reader woken every 64 samples | 200 | 2.78× | 1850 | 1.03× |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	for _, path := range programPaths {
		if !strings.Contains(out, "| gate/"+path+" |") || !strings.Contains(out, "| exact/"+path+" |") {
			t.Errorf("figure 1 lacks the %s rows", path)
		}
	}

	pat := regexp.MustCompile(benchPattern)
	for _, res := range r.bench {
		top, _, _ := strings.Cut(res.name, "/")
		if !pat.MatchString(top) {
			t.Errorf("benchPattern %q does not select %s", benchPattern, res.name)
		}
	}
	if pat.MatchString("BenchmarkLiveFramesX") {
		t.Errorf("benchPattern %q selects BenchmarkLiveFramesX", benchPattern)
	}
}

// TestSourcesTargetMet checks the 2.6× target's verdict on a run that
// meets it.
func TestSourcesTargetMet(t *testing.T) {
	r := &report{bench: parseBench([]byte("BenchmarkProgram/gate/sources-pass-2 \t 4194304\t 8.000 bare-ns/pkt\t 20.00 ns/pkt\t 2.500 x-bare\t 5 floor-atomics\t 1.9 floor-x-bare\n"))}
	var b strings.Builder
	r.sourcesTargets(func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) })
	if want := "| 2.50× (its floor of 5 atomic adds: 1.90×) | **met** |"; !strings.Contains(b.String(), want) {
		t.Errorf("targets lack %q:\n%s", want, b.String())
	}
}

func TestStat(t *testing.T) {
	s := statOf([]float64{5, 1, 3, 2, 4})
	if s.med != 3 || s.lo != 1 || s.hi != 5 {
		t.Errorf("stat %+v, want med 3 in [1, 5]", s)
	}
	if got := statOf([]float64{1, 2, 3, 4}).med; got != 2.5 {
		t.Errorf("median of 4 = %v, want 2.5", got)
	}
	if got := s.f(1); got != "3.0 [1.0, 5.0]" {
		t.Errorf("f = %q", got)
	}
}

// TestTimelineModel checks the window rule on a steady flood: 1000
// packets/ms for 2.5 s is two saturated windows and a half one, also
// saturated.
func TestTimelineModel(t *testing.T) {
	tab, err := tiers.Compile(benchPolicy(20000, time.Second), 0)
	if err != nil {
		t.Fatal(err)
	}
	var tl timeline
	tl = append(tl, point{0, 0})
	for ms := 10; ms <= 2500; ms += 5 {
		tl = append(tl, point{time.Duration(ms) * time.Millisecond, uint64(ms-10) * 1000})
	}
	tl = append(tl, point{3 * time.Second, tl[len(tl)-1].c})
	got, n := tl.model(tab, time.Second)
	if n != 3 {
		t.Errorf("%d windows, want 3", n)
	}
	if want := 3 * tab.Expected(1_000_000).Passed; math.Abs(got-want) > 1 {
		t.Errorf("model %.1f, want %.1f", got, want)
	}
	if d := tl.duration(); d < 2480*time.Millisecond || d > 2500*time.Millisecond {
		t.Errorf("duration %v, want about 2.49s", d)
	}
}

// TestAppLimiterIsTheModel runs the in-app limiter and model.Model on the
// same arrivals and the same random draws: they must agree on every
// message, windows included.
func TestAppLimiterIsTheModel(t *testing.T) {
	p := benchPolicy(1000, time.Second)
	tab, err := tiers.Compile(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	seed := [2]uint64{1, 2}
	lim := &appLimiter{tab: tab, window: int64(time.Second), rng: rand.NewPCG(seed[0], seed[1])}
	draws := rand.NewPCG(seed[0], seed[1])
	ref := model.NewModel(p, tab, func() uint32 { return uint32(draws.Uint64()) })
	now := int64(1)
	for i := 0; i < 20_000; i++ {
		now += int64(rand.IntN(200_000)) // up to 0.2 ms apart
		if i%5000 == 0 {
			now += int64(2 * time.Second) // a gap: the next message opens a window
		}
		pass := lim.admit(now)
		d := ref.Packet(uint64(now))
		if want := d.Verdict == tiers.VerdictPass; pass != want {
			t.Fatalf("message %d (n=%d, tier %d): in-app pass=%v, model %v", i, d.N, d.Tier, pass, d.Verdict)
		}
	}
	if lim.opened < 4 {
		t.Errorf("%d windows opened, want at least 4", lim.opened)
	}
}

func TestNFTRules(t *testing.T) {
	rules, err := nftRules(benchPolicy(20000, time.Second), "tlc000000")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"flush ruleset",
		"type filter hook ingress device \"tlc000000\"",
		"limit rate 14000/second burst 14000 packets counter accept",
		"limit rate 2000/second burst 2000 packets counter goto tier1",
		"limit rate 4000/second burst 4000 packets counter goto tier2",
		"goto tier3",
		"numgen random mod 10000 < 2000 counter drop",
		"numgen random mod 10000 < 5000 counter drop",
		"udp dport { 514 } jump tiers",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("rule set lacks %q:\n%s", want, rules)
		}
	}
	if !strings.HasPrefix(strings.SplitN(rules, "\n", 3)[2], "flush ruleset") {
		t.Errorf("flush ruleset is not the first statement:\n%s", rules)
	}
	if _, err := nftRules(benchPolicy(20000, 2*time.Second), "x"); err == nil {
		t.Error("a 2s window was accepted")
	}
}

func TestTrafgenConfig(t *testing.T) {
	f, err := frame(net.HardwareAddr{2, 0, 0, 0, 0, 2}, net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.IPv4(198, 51, 100, 2), net.IPv4(198, 51, 100, 1))
	if err != nil {
		t.Fatal(err)
	}
	cfg := trafgenConfig(f)
	if n := strings.Count(cfg, "0x"); n != len(f) {
		t.Errorf("%d bytes in the config, frame has %d", n, len(f))
	}
	if !strings.Contains(cfg, "{") || !strings.HasSuffix(cfg, "}\n") {
		t.Errorf("not one packet block:\n%s", cfg)
	}
	// UDP destination port 514 at offset 14 + 20 + 2.
	if f[36] != 514>>8 || f[37] != 514&0xff {
		t.Errorf("dport bytes %x %x", f[36], f[37])
	}
}
