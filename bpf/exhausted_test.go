package bpf_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// docs/design.md §6, "light groups lose nothing to a noisy one", in the
// program, paced in real time (BPF_PROG_TEST_RUN, 1 ms batches), the
// first window of a flood from idle, smooth shape (agent's
// TestFairShedding, with the flood's budget spent in its first batch):
// max 500, budget 10 % (50), source A sends its budget and 10 more at
// once, then 5,000 over 850 ms; ten light sources send 100 datagrams in
// turn, one each 8.5 ms (10 each, within their budget; 118 per window at
// their rate, with A's 50 at most 340 where the clock's elapsed fraction
// is read, under T_1 = 350). None is lost: A's spent budget is counted as
// it is and not extrapolated (sketch_over, sm_in_estimate). Before, the
// in-budget count with A's 50 in it was extrapolated from the window's
// start, 32 × n at first and past T_1 for about 150 ms: light datagrams
// were shed (TestFairShedding: 18–19 of 20 per light source).
// noisyLightLoss is the light datagrams of 100 the flood's window may
// shed (docs/design.md §6): 0–2 were measured in eight runs under the
// onset from the recent rate (issue 39), none before it.
const noisyLightLoss = 2

func TestSmoothNoisyGroupProgram(t *testing.T) {
	p := tiers.Default()
	p.Shape, p.Mode = tiers.ShapeSmooth, tiers.ModeEnforce
	p.Window, p.Max = time.Second, 500
	p.Tiers = []tiers.Tier{{At: tiers.Pct(70), Drop: tiers.Pct(20)}, {At: tiers.Pct(80), Drop: tiers.Pct(50)},
		{At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
	h := newHarness(t, p)
	for try := range 3 {
		lost, ok := noisyGroupRun(t, h)
		if !ok {
			t.Logf("try %d: the pacing stalled (the run left its window); again", try+1)
			continue
		}
		// docs/design.md §6: at most noisyLightLoss, the light packets
		// judged in the first milliseconds after a CPU latches, when the
		// in-budget rate is read from the clock on a count of one or two.
		if lost > noisyLightLoss {
			t.Errorf("light sources lost %d of 100 datagrams to a flood whose budget was spent, want at most %d", lost, noisyLightLoss)
		}
		return
	}
	t.Fatal("the pacing stalled in three tries")
}

// noisyGroupRun is one run of TestSmoothNoisyGroupProgram from idle: the
// light datagrams lost, and whether the run stayed in its window.
func noisyGroupRun(t *testing.T, h *harness) (int, bool) {
	t.Helper()
	h.expire()
	flood := udpFrom(t, netip.MustParseAddr("198.51.100.10"))
	light := make([][]byte, 10)
	for i := range light {
		light[i] = udpFrom(t, netip.AddrFrom4([4]byte{198, 51, 100, byte(20 + i)}))
	}
	const (
		spread  = 850 * time.Millisecond
		floodN  = 5000
		lightN  = 100
		firstA  = 60
		lightEv = spread / lightN
	)
	for range firstA {
		h.run(flood)
	}
	id := h.window().Opened
	start := time.Now()
	sentA, sentL, lost := firstA, 0, 0
	for sentL < lightN {
		el := time.Since(start)
		if el > spread+50*time.Millisecond {
			return 0, false
		}
		for due := min(firstA+int(int64(floodN)*int64(el)/int64(spread)), floodN+firstA); sentA < due; sentA++ {
			h.run(flood)
		}
		for due := min(int(el/lightEv)+1, lightN); sentL < due; sentL++ {
			if h.run(light[sentL%len(light)]) != xdpPass {
				lost++
				t.Logf("light datagram %d (%v into the window) dropped", sentL, el.Round(time.Millisecond))
			}
		}
		time.Sleep(time.Millisecond - time.Since(start)%time.Millisecond)
	}
	if h.window().Opened != id {
		return 0, false
	}
	t.Logf("A sent %d, light sent %d, lost %d", sentA, sentL, lost)
	return lost, true
}
