package agent_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// PRIs of the severity case: user.crit, user.info, user.debug.
const (
	priCrit  = 10
	priInfo  = 14
	priDebug = 15
)

// severityFlood is the flood: per window exactly 1% user.crit, 49%
// user.info and 50% user.debug, in a random order (seeded, so that the
// model can replay the exact sequence).
type severityFlood struct {
	pri [][]int // [burst][seq]
}

func newSeverityFlood(bursts, perBurst int, seed uint64) severityFlood {
	rng := rand.New(rand.NewPCG(seed, 1))
	f := severityFlood{pri: make([][]int, bursts)}
	for b := range f.pri {
		f.pri[b] = make([]int, perBurst)
		for i := range f.pri[b] {
			switch {
			case i < perBurst/100:
				f.pri[b][i] = priCrit
			case i < perBurst/2:
				f.pri[b][i] = priInfo
			default:
				f.pri[b][i] = priDebug
			}
		}
		rng.Shuffle(perBurst, func(i, j int) { f.pri[b][i], f.pri[b][j] = f.pri[b][j], f.pri[b][i] })
	}
	return f
}

func (f severityFlood) message(burst, seq int) []byte {
	return fmt.Appendf(nil, "<%d>1 2026-11-30T00:00:00.000Z sender tltest 4242 ID47 - burst=%d seq=%d", f.pri[burst][seq], burst, seq)
}

// expected replays the first sent[b] datagrams of each burst through the
// model 400 times and returns, per PRI and in total, the mean passed and
// its standard deviation.
func (f severityFlood) expected(p tiers.Policy, sent []int) (mean, sd map[int]float64) {
	tab, _ := tiers.Compile(p, 0)
	const runs = 400
	sum, sumSq := map[int]float64{}, map[int]float64{}
	for r := range runs {
		m := model.NewModel(p, tab, rand.New(rand.NewPCG(uint64(r), 9)).Uint32)
		passed := map[int]float64{}
		var now uint64
		for b, n := range sent {
			now += uint64(p.Window) + 1
			for _, pri := range f.pri[b][:n] {
				now++
				if m.PacketSeverity(now, pri%8).Verdict == tiers.VerdictPass {
					passed[pri]++
					passed[-1]++ // total
				}
			}
		}
		for _, k := range []int{priCrit, priInfo, priDebug, -1} {
			sum[k] += passed[k]
			sumSq[k] += passed[k] * passed[k]
		}
	}
	mean, sd = map[int]float64{}, map[int]float64{}
	for k := range sum {
		mean[k] = sum[k] / runs
		sd[k] = math.Sqrt(max(sumSq[k]/runs-mean[k]*mean[k], 0))
	}
	return mean, sd
}

// TestSeverityFlood is the case severity exists for: a flood at 5 × max of
// mostly info and debug, with 1% crit, through the agent on a veth into a
// real UDP socket. With the severity block, crit gets through (≥ 99%), debug
// is shed before info, and the total stays what the model says. The same
// flood without it passes crit at the seed's overall rate.
func TestSeverityFlood(t *testing.T) {
	testenv.Require(t)
	const (
		maxPkts  = 1000
		bursts   = 4
		perBurst = 5 * maxPkts
	)
	p := newPair(t)
	pol := policy(t, maxPkts)
	pol.Severity = &tiers.Severity{Protect: []int{0, 1, 2, 3}, ProtectBudget: tiers.Pct(5), ShedFirst: []int{7}}
	a := startAgent(t, p, attach.XDPAuto, pol)
	dst := netip.AddrPortFrom(p.CollAddr, 514)
	rx := testenv.NewReceiver(t, p.Coll, dst)
	tx := testenv.NewSender(t, p.Send, dst)
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")
	if t.Failed() {
		t.FailNow()
	}

	run := func(name string, flood severityFlood) (sent []int, byPRI map[int]int) {
		t.Helper()
		return sendSeverity(t, a, rx, tx, name, flood, bursts, perBurst)
	}
	// With severity.
	flood := newSeverityFlood(bursts, perBurst, 1)
	sent, got := run("with severity", flood)
	mean, sd := flood.expected(pol, sent)
	crit, info, debug := flood.sentCount(sent, priCrit), flood.sentCount(sent, priInfo), flood.sentCount(sent, priDebug)
	total := got[priCrit] + got[priInfo] + got[priDebug]
	t.Logf("model: crit %.1f, info %.1f, debug %.1f", mean[priCrit], mean[priInfo], mean[priDebug])
	t.Logf("with severity: crit %d/%d (%.1f%%), info %d/%d (%.1f%%), debug %d/%d (%.1f%%); total %d, model %.1f ± %.1f (5σ)",
		got[priCrit], crit, 100*passRate(got[priCrit], crit), got[priInfo], info, 100*passRate(got[priInfo], info),
		got[priDebug], debug, 100*passRate(got[priDebug], debug), total, mean[-1], 5*sd[-1])
	if passRate(got[priCrit], crit) < 0.99 {
		t.Errorf("crit received %d of %d, want >= 99%%", got[priCrit], crit)
	}
	if passRate(got[priDebug], debug) >= passRate(got[priInfo], info) {
		t.Errorf("debug passed at %.3f, not below info's %.3f", passRate(got[priDebug], debug), passRate(got[priInfo], info))
	}
	if d := math.Abs(float64(total) - mean[-1]); d > 5*sd[-1]+1 {
		t.Errorf("total received %d, model %.1f ± %.1f (5σ)", total, mean[-1], 5*sd[-1]+1)
	}
	// The metrics account for every received datagram by class.
	m := gather(t, a)
	for _, c := range []struct {
		class string
		want  int
	}{{"protected", got[priCrit]}, {"normal", got[priInfo]}, {"shed_first", got[priDebug]}} {
		if v := m.sum("tierlimit_severity_packets_total", `class="`+c.class+`"`, `verdict="pass"`); int(v) != c.want {
			t.Errorf("severity_packets_total{class=%q,verdict=pass} = %.0f, receiver got %d", c.class, v, c.want)
		}
	}
	if m["tierlimit_protected_passed_packets_total"] == 0 {
		t.Error("protected_passed_packets_total is 0: protection never acted")
	}

	// The same flood without severity: crit is shed like everything else.
	plain := pol.Clone()
	plain.Severity = nil
	if err := a.Reload(context.Background(), plain); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // let the last window expire
	sent2, got2 := run("without severity", flood)
	mean2, sd2 := flood.expected(plain, sent2)
	crit2 := flood.sentCount(sent2, priCrit)
	t.Logf("without severity: crit %d/%d (%.1f%%), model %.1f ± %.1f (5σ); overall %.1f%%",
		got2[priCrit], crit2, 100*passRate(got2[priCrit], crit2), mean2[priCrit], 5*sd2[priCrit],
		100*passRate(got2[priCrit]+got2[priInfo]+got2[priDebug], crit2+flood.sentCount(sent2, priInfo)+flood.sentCount(sent2, priDebug)))
	if d := math.Abs(float64(got2[priCrit]) - mean2[priCrit]); d > 5*sd2[priCrit]+1 {
		t.Errorf("without severity, crit received %d, model %.1f ± %.1f", got2[priCrit], mean2[priCrit], 5*sd2[priCrit]+1)
	}
}

// sendSeverity sends flood in bursts through tx and returns what each
// burst sent and what rx received from it by PRI.
func sendSeverity(t *testing.T, a *agent.Agent, rx *testenv.Receiver, tx *testenv.Sender, name string, flood severityFlood, bursts, perBurst int) (sent []int, byPRI map[int]int) {
	t.Helper()
	before := rx.CountsByPRI()
	selected := int(gather(t, a).sum("tierlimit_selected_packets_total"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sent, err := tx.SendBursts(ctx, testenv.Bursts{
		Count: bursts, PerBurst: perBurst, Message: flood.message,
		Spread: 850 * time.Millisecond, Budget: 950 * time.Millisecond, Period: 1100 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("%s: send: %v (sent %v)", name, err, sent)
	}
	total := 0
	for _, n := range sent {
		total += n
	}
	// Once the program has seen every datagram, wait for the socket to
	// drain all it passed, then for quiet, so a late extra shows too.
	m := waitSelectedMetrics(t, a, selected+total)
	rx.WaitTotal(int(m.sum("tierlimit_selected_packets_total", `verdict="pass"`)), 10*time.Second)
	rx.WaitQuiet(200*time.Millisecond, 5*time.Second)
	after := rx.CountsByPRI()
	byPRI = map[int]int{}
	for k, v := range after {
		byPRI[k] = v - before[k]
	}
	return sent, byPRI
}

// sentCount is how many datagrams of pri the bursts sent.
func (f severityFlood) sentCount(sent []int, pri int) int {
	n := 0
	for b, k := range sent {
		for _, x := range f.pri[b][:k] {
			if x == pri {
				n++
			}
		}
	}
	return n
}

// passRate is got of of, 0 when of is 0.
func passRate(got, of int) float64 { return float64(got) / float64(max(of, 1)) }
