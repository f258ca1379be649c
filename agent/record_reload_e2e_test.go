package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// pcapCount reads every record file in dir: the packets, each with one
// comment that parses, and the longest capture.
func pcapCount(t *testing.T, dir string) (packets, maxCap int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "shed-*.pcapng"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		n, c := pcapFileCount(t, name)
		packets, maxCap = packets+n, max(maxCap, c)
	}
	return packets, maxCap
}

// pcapFileCount reads one record file as pcapCount does.
func pcapFileCount(t *testing.T, name string) (packets, maxCap int) {
	t.Helper()
	packets, maxCap, err := pcapFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return packets, maxCap
}

// pcapFile reads one record file with gopacket: its packets, each with
// one comment that parses, and the longest capture. Any goroutine may call
// it.
func pcapFile(name string) (packets, maxCap int, err error) {
	f, err := os.Open(name)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", name, err)
	}
	for {
		data, _, opts, err := r.ReadPacketDataWithOptions()
		if errors.Is(err, io.EOF) {
			return packets, maxCap, nil
		}
		if err != nil {
			return 0, 0, fmt.Errorf("%s: packet %d: %w", name, packets, err)
		}
		if len(opts.Comments) != 1 {
			return 0, 0, fmt.Errorf("%s: packet with comments %q", name, opts.Comments)
		}
		if _, err := record.ParseSampleComment(opts.Comments[0]); err != nil {
			return 0, 0, err
		}
		packets++
		maxCap = max(maxCap, len(data))
	}
}

// episodesOf lists the episode ids and events of reports.
func episodesOf(reps []report) (ids map[string]int, events []string) {
	ids = map[string]int{}
	for _, r := range reps {
		ids[r.params["episode"]]++
		events = append(events, r.event)
	}
	return ids, events
}

// TestRecordReloadLive changes the shed record by reloads while one
// episode goes on under a flood: sampling turned on from samples: 0 with a
// dir and an events destination; then a new dir, snaplen, max_bytes and
// destination; then a dir the agent cannot make, refused and counted with
// the old record going on; then a shorter window, which the tracker
// follows. Every sample the agent counts written is in one of the two
// dirs, each dir's captures within its snaplen, and every report of the
// one episode reaches the destination in force when it was made.
func TestRecordReloadLive(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pol := recordPolicy(t, "", "")
	pol.Record = tiers.Record{}
	a := startAgent(t, p, attach.XDPAuto, pol)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep, err := a.StartRecord(ctx, pol, "")
	if err != nil {
		t.Fatal(err)
	}
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")
	src := []netip.Addr{p.SendAddr}
	flood := func(d time.Duration) { floodFrom(t, p, src, []int{2000}, d) }
	reload := func(q tiers.Policy) {
		t.Helper()
		if err := q.Validate(); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(context.Background(), q); err != nil {
			t.Fatalf("reload: %v", err)
		}
	}

	flood(time.Second)
	eventually(t, 3*time.Second, func() bool { return ep.Current().Open })
	if ep.Recorder() != nil {
		t.Fatal("sampling off: a recorder runs")
	}
	// On: samples, a dir and a destination.
	dirA, dirB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	addr1, reports1 := listenReports(t)
	on := recordPolicy(t, dirA, "udp://"+addr1)
	reload(on)
	flood(2 * time.Second)
	logPhase(t, a, "on")
	nA, capA := pcapCount(t, dirA)
	if ep.Recorder() == nil || nA < 50 || capA > 128 {
		t.Fatalf("sampling turned on: %d samples in %s, longest %d bytes; want at least 50 of at most 128", nA, dirA, capA)
	}
	// Another dir, snaplen, max_bytes and destination.
	addr2, reports2 := listenReports(t)
	moved := recordPolicy(t, dirB, "udp://"+addr2)
	moved.Record.Snaplen, moved.Record.MaxBytes = 64, 2<<20
	reload(moved)
	flood(2 * time.Second)
	logPhase(t, a, "moved")
	refuseBadRecord(t, a, moved) // the old record goes on
	nB0, _ := pcapCount(t, dirB)
	flood(time.Second)
	nB, capB := pcapCount(t, dirB)
	if nB0 < 50 || nB < nB0+50 || capB > 64 {
		t.Errorf("%s: %d samples after the move, %d after the refused reloads, longest %d bytes; want 50 more each, at most 64", dirB, nB0, nB, capB)
	}
	// A shorter window: 3 quiet windows of 250 ms close the episode.
	short := moved
	short.Window = 250 * time.Millisecond
	reload(short)
	flood(time.Second)
	end := time.Now()
	eventually(t, 5*time.Second, func() bool { return !ep.Current().Open })
	if d := time.Since(end); d > 1600*time.Millisecond {
		t.Errorf("closed %v after the flood, want within 3 windows of 250 ms and a tick (the 1 s window's would take 3 s)", d)
	}
	time.Sleep(200 * time.Millisecond) // the close report's datagram

	checkReloadEnd(t, a, dirA, dirB, reports1(), reports2())
}

// refuseBadRecord reloads q with a dir under a file, then with snaplen
// 0: both refused, with ErrRecordDir and tiers.ErrRecord.
func refuseBadRecord(t *testing.T, a *agent.Agent, q tiers.Policy) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := q
	bad.Record.Dir = filepath.Join(file, "shed")
	if err := a.Reload(context.Background(), bad); !errors.Is(err, record.ErrDir) {
		t.Errorf("reload with a dir under a file: %v, want ErrRecordDir", err)
	}
	bad = q
	bad.Record.Snaplen = 0
	if err := a.Reload(context.Background(), bad); !errors.Is(err, tiers.ErrRecord) {
		t.Errorf("reload with snaplen 0: %v, want ErrRecord", err)
	}
}

// checkReloadEnd: every sample the agent counts written is in dirA or
// dirB, none lost; 3 reloads succeeded and 2 were refused; each
// destination got reports of episode 1 only, the second its close; every
// report sent was received.
func checkReloadEnd(t *testing.T, a *agent.Agent, dirA, dirB string, reps1, reps2 []report) {
	t.Helper()
	nA2, _ := pcapCount(t, dirA)
	nB, _ := pcapCount(t, dirB)
	m := gather(t, a)
	written, lost := m.sum("tierlimit_shed_samples_total", `result="written"`), m.sum("tierlimit_shed_samples_total", `result="lost"`)
	t.Logf("samples: %d in %s, %d in %s; written %v, lost %v", nA2, dirA, nB, dirB, written, lost)
	if written != float64(nA2+nB) || lost != 0 {
		t.Errorf("samples written %v lost %v, want every one of the %d in the two dirs, none lost", written, lost, nA2+nB)
	}
	if ok, bad := m.sum("tierlimit_config_reloads_total", `result="success"`), m.sum("tierlimit_config_reloads_total", `result="error"`); ok != 3 || bad != 2 {
		t.Errorf("config_reloads_total success %v error %v, want 3 and 2", ok, bad)
	}
	ids1, ev1 := episodesOf(reps1)
	ids2, ev2 := episodesOf(reps2)
	t.Logf("destination 1: %v; destination 2: %v", ev1, ev2)
	if len(ids1) != 1 || ids1["1"] == 0 || len(ids2) != 1 || ids2["1"] == 0 || ev2[len(ev2)-1] != "close" {
		t.Errorf("reports of episodes %v then %v (%v, %v); want episode 1's summaries at each, its close at the second", ids1, ids2, ev1, ev2)
	}
	// The sender counts a report once its write returned, which may be
	// after the receiver read the datagram: the count is read again until
	// it settles (bounded), on a loaded machine a few ms later.
	sent := m.sum("tierlimit_event_reports_total", `result="sent"`)
	for deadline := time.Now().Add(2 * time.Second); int(sent) != len(ev1)+len(ev2) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		m = gather(t, a)
		sent = m.sum("tierlimit_event_reports_total", `result="sent"`)
	}
	if int(sent) != len(ev1)+len(ev2) || m.sum("tierlimit_shed_episodes_total") != 1 {
		t.Errorf("reports sent %v, received %d; episodes %v, want 1", sent, len(ev1)+len(ev2), m.sum("tierlimit_shed_episodes_total"))
	}
}

// logPhase logs the program's samples and drops so far.
func logPhase(t *testing.T, a *agent.Agent, phase string) {
	t.Helper()
	sampled, lost, err := a.Limiter().RecordCounts()
	m := gather(t, a)
	t.Logf("%s: program sampled %d lost %d (%v); agent written %v; drops %v", phase, sampled, lost, err,
		m.sum("tierlimit_shed_samples_total", `result="written"`), m.sum("tierlimit_selected_packets_total", `verdict="drop"`))
}

// eventually polls ok every 50 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
