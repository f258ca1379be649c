package main

import (
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

func TestParseBench(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkProgram/gate/selected-pass-2         	 4194304	        34.50 bare-ns/pkt	        66.25 ns/pkt	         1.920 x-bare
BenchmarkLiveFrames-2   	 4194304	         7.640 Mpps	        12.49 bare-Mpps	         0.6117 x-bare
PASS
`)
	rs := parseBench(out)
	if len(rs) != 2 {
		t.Fatalf("parsed %d results, want 2", len(rs))
	}
	if got := values(rs, "BenchmarkProgram/gate/selected-pass", "x-bare"); len(got) != 1 || got[0] != 1.92 {
		t.Errorf("x-bare = %v, want [1.92]", got)
	}
	if got := values(rs, "BenchmarkLiveFrames", "Mpps"); len(got) != 1 || got[0] != 7.64 {
		t.Errorf("Mpps = %v, want [7.64]", got)
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
	tab, err := tiers.Compile(benchPolicy(20000, time.Second))
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

// TestAppLimiterIsTheModel runs the in-app limiter and tiers.Model on the
// same arrivals and the same random draws: they must agree on every
// message, windows included.
func TestAppLimiterIsTheModel(t *testing.T) {
	p := benchPolicy(1000, time.Second)
	tab, err := tiers.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	seed := [2]uint64{1, 2}
	lim := &appLimiter{tab: tab, window: int64(time.Second), rng: rand.NewPCG(seed[0], seed[1])}
	draws := rand.NewPCG(seed[0], seed[1])
	model := tiers.NewModel(p, tab, func() uint32 { return uint32(draws.Uint64()) })
	now := int64(1)
	for i := 0; i < 20_000; i++ {
		now += int64(rand.IntN(200_000)) // up to 0.2 ms apart
		if i%5000 == 0 {
			now += int64(2 * time.Second) // a gap: the next message opens a window
		}
		pass := lim.admit(now)
		d := model.Packet(uint64(now))
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
