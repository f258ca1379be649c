package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// recordMax is the e2e policy's max: small, so that a flood a loaded
// 2-vCPU machine sends for sure sheds most of itself.
const recordMax = 200

// recordPolicy sheds from recordMax per 1 s window on, samples at 100/s
// into dir and reports to events (udp://, tcp://, or "").
func recordPolicy(t *testing.T, dir, events string) tiers.Policy {
	t.Helper()
	p := policy(t, recordMax)
	p.Record = tiers.Record{Samples: 100, Snaplen: 128, Dir: dir, MaxBytes: 1 << 20}
	p.Events = tiers.Events{SummaryEvery: time.Second}
	if events != "" {
		var err error
		if p.Events.Network, p.Events.Addr, err = tiers.ParseSyslogURL(events); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

// report is one received episode report: when, and its event and params.
type report struct {
	at     time.Time
	event  string
	params map[string]string
}

// listenReports collects the RFC 5424 reports a UDP socket on loopback
// receives until t ends.
func listenReports(t *testing.T) (addr string, got func() []report) {
	t.Helper()
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var (
		mu   sync.Mutex
		reps []report
	)
	go func() {
		buf := make([]byte, 8192)
		for {
			n, _, err := ln.ReadFrom(buf)
			if err != nil {
				return
			}
			msg := string(buf[:n])
			r := report{at: time.Now(), params: sdParams(msg)}
			r.event = r.params["event"]
			mu.Lock()
			reps = append(reps, r)
			mu.Unlock()
		}
	}()
	return ln.LocalAddr().String(), func() []report {
		mu.Lock()
		defer mu.Unlock()
		return append([]report(nil), reps...)
	}
}

// sdParams reads the shed@32473 params of a message (values without
// escapes, which these tests do not produce).
func sdParams(msg string) map[string]string {
	out := map[string]string{}
	i := strings.Index(msg, "[shed@32473")
	j := strings.Index(msg, "] ")
	if i < 0 || j < i {
		return out
	}
	for _, f := range strings.Split(msg[i+len("[shed@32473"):j], `" `) {
		k, v, _ := strings.Cut(strings.TrimSpace(f), `="`)
		out[k] = strings.TrimSuffix(v, `"`)
	}
	return out
}

// floodFrom sends rate datagrams per second from each of srcs (added to
// the sender veth) for d, in 100 ms slices.
func floodFrom(t *testing.T, p *testenv.Pair, srcs []netip.Addr, rates []int, d time.Duration) {
	t.Helper()
	dst := netip.AddrPortFrom(p.CollAddr, 514)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), d+5*time.Second)
	defer cancel()
	for i, src := range srcs {
		tx := testenv.NewSenderFrom(t, p.Send, src, dst)
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := func(int) []byte { return testenv.SyslogMessage(1, i) }
			tx.Pace(ctx, int(float64(rates[i])*d.Seconds()), d, d+time.Second, msg)
		}()
	}
	wg.Wait()
}

// TestRecordEpisodeVeth floods the collector veth from two noisy sources
// (2:1) and checks the shed record end to end: the open report within a
// window or so of the flood, summaries every second while it lasts, the
// close 3 windows after it, the top groups naming the two sources first
// with their shares within 5σ, and pcapng files whose packets and comments
// parse.
func TestRecordEpisodeVeth(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	srcA, srcB := netip.MustParseAddr("198.51.100.11"), netip.MustParseAddr("198.51.100.12")
	for _, s := range []netip.Addr{srcA, srcB} {
		testenv.AddAddr(t, p.Send, p.SendIf, netip.PrefixFrom(s, 32))
	}
	dir := filepath.Join(t.TempDir(), "shed")
	addr, reports := listenReports(t)
	pol := recordPolicy(t, dir, "udp://"+addr)
	a := startAgent(t, p, attach.XDPAuto, pol)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	state := filepath.Join(t.TempDir(), "episode.json")
	ep, err := a.StartRecord(ctx, pol, state)
	if err != nil {
		t.Fatal(err)
	}
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")

	const flood = 4 * time.Second
	m0 := gather(t, a)
	start := time.Now()
	floodFrom(t, p, []netip.Addr{srcA, srcB}, []int{2000, 1000}, flood)
	end := time.Now()
	if m := gather(t, a); m.sum("tierlimit_shedding") != 1 {
		t.Errorf("shedding = %v right after the flood, want 1", m.sum("tierlimit_shedding"))
	}
	deadline := time.Now().Add(10 * time.Second)
	for ep.Current().Open && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the close report's datagram
	reps := reports()
	var kinds []string
	for _, r := range reps {
		kinds = append(kinds, r.event)
	}
	t.Logf("reports: %v", kinds)
	if len(reps) < 4 || reps[0].event != "open" || reps[len(reps)-1].event != "close" {
		t.Fatalf("reports %v, want open, summaries, close", kinds)
	}
	if d := reps[0].at.Sub(start); d > 2500*time.Millisecond {
		t.Errorf("open report %v after the flood began, want within a window (1 s) and a tick", d)
	}
	if d := reps[len(reps)-1].at.Sub(end); d < 2*time.Second || d > 6*time.Second {
		t.Errorf("close report %v after the flood ended, want after 3 quiet 1 s windows", d)
	}
	if n := len(reps) - 2; n < 2 {
		t.Errorf("%d summaries over a %v flood every 1 s, want at least 2", n, flood)
	}
	checkTopGroups(t, reps[len(reps)-1].params, srcA, srcB)
	checkPcapDir(t, dir, srcA, srcB)

	m := gather(t, a)
	checkWeights(t, reps, m0, m)
	if m.sum("tierlimit_shedding") != 0 || m.sum("tierlimit_shed_episodes_total") != 1 ||
		m.sum("tierlimit_shed_samples_total", `result="written"`) < 100 ||
		m.sum("tierlimit_event_reports_total", `result="sent"`) != float64(len(reps)) ||
		m.sum("tierlimit_event_reports_total", `result="error"`) != 0 {
		t.Errorf("metrics: shedding %v episodes %v samples written %v lost %v reports sent %v error %v (received %d)",
			m.sum("tierlimit_shedding"), m.sum("tierlimit_shed_episodes_total"),
			m.sum("tierlimit_shed_samples_total", `result="written"`), m.sum("tierlimit_shed_samples_total", `result="lost"`),
			m.sum("tierlimit_event_reports_total", `result="sent"`), m.sum("tierlimit_event_reports_total", `result="error"`), len(reps))
	}
	if saved, err := record.ReadEpisode(state); err != nil || saved.ID != 1 || saved.Open || len(saved.Top) < 2 {
		t.Errorf("state file: %+v, %v", saved, err)
	}
}

// checkWeights: the reports' spans follow each other, each one's
// pass_frac is its passed / offered, and together they count the flood's
// selected datagrams as the metrics do (m0 before it, m after the close),
// less those of the flood's first window before the tick that saw its
// first shed (at most recordMax: none is shed before n passes 70 % of it).
func checkWeights(t *testing.T, reps []report, m0, m metrics) {
	t.Helper()
	var offered, passed float64
	prevTo := ""
	for _, r := range reps {
		var o, p, f float64
		_, err1 := fmtSscan(r.params["offered"], &o)
		_, err2 := fmtSscan(r.params["passed"], &p)
		_, err3 := fmtSscan(r.params["pass_frac"], &f)
		if err1 != nil || err2 != nil || err3 != nil || o > 0 && math.Abs(f-p/o) > 5e-6 || o == 0 && f != 1 ||
			prevTo != "" && r.params["weights_from"] != prevTo {
			t.Errorf("%s report: offered %q passed %q pass_frac %q from %q (last to %q)", r.event, r.params["offered"],
				r.params["passed"], r.params["pass_frac"], r.params["weights_from"], prevTo)
		}
		prevTo = r.params["weights_to"]
		offered += o
		passed += p
	}
	total := m.sum("tierlimit_selected_packets_total") - m0.sum("tierlimit_selected_packets_total")
	pass := m.sum("tierlimit_selected_packets_total", `verdict="pass"`) - m0.sum("tierlimit_selected_packets_total", `verdict="pass"`)
	t.Logf("reports' weights: %.0f passed of %.0f offered; metrics: %.0f of %.0f", passed, offered, pass, total)
	if offered > total || offered < total-recordMax || passed > pass || passed < pass-recordMax {
		t.Errorf("reports count %.0f passed of %.0f offered, metrics %.0f of %.0f (at most %d before the first span)",
			passed, offered, pass, total, recordMax)
	}
}

// checkTopGroups: the close report's top groups are A then B, their
// shares of the samples within 5σ of A's 2/3 and B's 1/3.
func checkTopGroups(t *testing.T, params map[string]string, a, b netip.Addr) {
	t.Helper()
	top := strings.Split(params["top_sampled"], ",")
	n := 0.0
	if _, err := fmtSscan(params["samples"], &n); err != nil || n < 100 || len(top) < 2 {
		t.Fatalf("close report: samples %q top %q", params["samples"], params["top_sampled"])
	}
	for i, want := range []struct {
		group string
		share float64
	}{{a.String() + "/32", 2.0 / 3}, {b.String() + "/32", 1.0 / 3}} {
		g, s, _ := strings.Cut(top[i], ":")
		var share float64
		fmtSscan(s, &share)
		// The slack: the flood's first window samples the first shed
		// packet after each token (the share is set from the window
		// before), which can favour either sender.
		bound := 5*math.Sqrt(want.share*(1-want.share)/n) + 0.02
		t.Logf("top group %d: %s at %.3f (true %.3f ± %.3f, %v samples)", i+1, g, share, want.share, bound, n)
		if g != want.group || math.Abs(share-want.share) > bound {
			t.Errorf("top group %d: %s at %.3f, want %s at %.3f ± %.3f (%v samples)", i+1, g, share, want.group, want.share, bound, n)
		}
	}
}

// checkPcapDir reads every pcapng file: each packet has a comment naming
// one of the sources' groups, and the frame is a shed UDP/514 datagram.
func checkPcapDir(t *testing.T, dir string, srcs ...netip.Addr) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "shed-*.pcapng"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no pcapng files in %s: %v", dir, err)
	}
	packets := 0
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for {
			data, ci, opts, err := r.ReadPacketDataWithOptions()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			packets++
			if len(opts.Comments) != 1 || ci.CaptureLength != len(data) || len(data) > 128 {
				t.Fatalf("%s: packet with comments %q, %d bytes", name, opts.Comments, len(data))
			}
			kv, err := record.ParseSampleComment(opts.Comments[0])
			if err != nil {
				t.Fatal(err)
			}
			ok := false
			for _, s := range srcs {
				ok = ok || kv["group"] == s.String()+"/32"
			}
			if !ok || kv["reason"] != "tier" || kv["verdict"] != "drop" {
				t.Errorf("%s: comment %q", name, opts.Comments[0])
			}
		}
		f.Close()
	}
	if packets < 100 {
		t.Errorf("%d packets in %d files, want at least 100", packets, len(files))
	}
}

// TestRecordEventsDown: with the events destination refusing (TCP, no
// listener) the agent keeps shedding, counts every report as an error,
// and the episode opens and closes as ever.
func TestRecordEventsDown(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused from here on
	pol := recordPolicy(t, "", "tcp://"+addr)
	a := startAgent(t, p, attach.XDPAuto, pol)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep, err := a.StartRecord(ctx, pol, "")
	if err != nil {
		t.Fatal(err)
	}
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")
	floodFrom(t, p, []netip.Addr{p.SendAddr}, []int{2000}, 3*time.Second)
	m := gather(t, a)
	if drops := m.sum("tierlimit_selected_packets_total", `verdict="drop"`); drops < 2000 {
		t.Errorf("%v drops, want most of the flood shed", drops)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ep.Current().Open && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // the sender's last dial
	m = gather(t, a)
	sent, errs := m.sum("tierlimit_event_reports_total", `result="sent"`), m.sum("tierlimit_event_reports_total", `result="error"`)
	if c := ep.Current(); c.ID != 1 || c.Open || sent != 0 || errs < 4 {
		t.Errorf("episode %+v; reports sent %v error %v, want closed, 0, at least open+2 summaries+close", c, sent, errs)
	}
	if n := len(ep.Recorder().Recent()); n < 100 {
		t.Errorf("%d samples in memory, want at least 100", n)
	}
}

// fmtSscan reads one number.
func fmtSscan(s string, v *float64) (int, error) { return fmt.Sscan(s, v) }

// TestRecordDirUnusable: a record dir that cannot be made (its parent is a
// file) costs the samples, counted lost, and nothing else: the agent
// sheds and keeps the samples in memory.
func TestRecordDirUnusable(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	parent := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(parent, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pol := recordPolicy(t, filepath.Join(parent, "shed"), "")
	a := startAgent(t, p, attach.XDPAuto, pol)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep, err := a.StartRecord(ctx, pol, "")
	if err != nil {
		t.Fatal(err)
	}
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")
	floodFrom(t, p, []netip.Addr{p.SendAddr}, []int{2000}, 2*time.Second)
	time.Sleep(200 * time.Millisecond)
	m := gather(t, a)
	lost, written := m.sum("tierlimit_shed_samples_total", `result="lost"`), m.sum("tierlimit_shed_samples_total", `result="written"`)
	if drops := m.sum("tierlimit_selected_packets_total", `verdict="drop"`); drops < 2000 || lost < 100 || written != 0 {
		t.Errorf("drops %v, samples lost %v written %v: want the flood shed and every sample lost", drops, lost, written)
	}
	if n := len(ep.Recorder().Recent()); n < 100 {
		t.Errorf("%d samples in memory, want at least 100", n)
	}
}
