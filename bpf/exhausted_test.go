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
// noisyLightLoss is the light datagrams of 100, sent on time, the flood's
// window may shed (docs/design.md §6): none. The live in-budget rate read
// from the clock after a latch is n − 1 over the time to the n-th
// (tiers.SmoothClockLive), and a sender that never sends ahead of its
// schedule cannot make that more than its rate. When it was n over that
// time, 1 of 100 was lost in 4 of 10 runs (a packet a few milliseconds
// after a CPU's latch read as 10⁴ a window); a datagram sent late, in a
// catch-up after the pacing stalled, may still be read so, and is logged,
// not judged.
const noisyLightLoss = 0

func TestSmoothNoisyGroupProgram(t *testing.T) {
	p := tiers.Default()
	p.Shape, p.Mode = tiers.ShapeSmooth, tiers.ModeEnforce
	p.Window, p.Max = time.Second, 500
	p.Tiers = []tiers.Tier{{At: tiers.Pct(70), Drop: tiers.Pct(20)}, {At: tiers.Pct(80), Drop: tiers.Pct(50)},
		{At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	p.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
	h := newHarness(t, p)
	for try := range 3 {
		lost, late, ok := noisyGroupRun(t, h)
		if !ok {
			t.Logf("try %d: the pacing stalled (the run left its window); again", try+1)
			continue
		}
		// docs/design.md §6: light groups lose nothing once the noisy
		// group has spent its budget.
		if lost > noisyLightLoss {
			t.Errorf("light sources lost %d of 100 datagrams sent on time to a flood whose budget was spent (%d more sent late), want at most %d", lost, late, noisyLightLoss)
		}
		return
	}
	t.Fatal("the pacing stalled in three tries")
}

// noisyGroupRun is one run of TestSmoothNoisyGroupProgram from idle: the
// light datagrams lost of those sent on time and of those sent more than
// a millisecond after their slot, and whether the run stayed in its
// window.
func noisyGroupRun(t *testing.T, h *harness) (lost, late int, ok bool) {
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
	sentA, sentL := firstA, 0
	for sentL < lightN {
		el := time.Since(start)
		if el > spread+50*time.Millisecond {
			return 0, 0, false
		}
		for due := min(firstA+int(int64(floodN)*int64(el)/int64(spread)), floodN+firstA); sentA < due; sentA++ {
			h.run(flood)
		}
		for due := min(int(el/lightEv)+1, lightN); sentL < due; sentL++ {
			if h.run(light[sentL%len(light)]) != xdpPass {
				behind := el - time.Duration(sentL)*lightEv
				if behind > time.Millisecond {
					late++
				} else {
					lost++
				}
				t.Logf("light datagram %d (%v into the window, %v after its slot) dropped", sentL, el.Round(time.Millisecond), behind.Round(100*time.Microsecond))
			}
		}
		time.Sleep(time.Millisecond - time.Since(start)%time.Millisecond)
	}
	if h.window().Opened != id {
		return 0, 0, false
	}
	t.Logf("A sent %d, light sent %d, lost %d on time and %d sent late", sentA, sentL, lost, late)
	return lost, late, true
}
