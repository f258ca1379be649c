package main

import (
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestRecordKillDashNine kills `tierlimit run` with SIGKILL while it
// writes samples at 1000/s under a flood: every pcapng file it left reads,
// in gopacket's reader and in tshark where installed, to its last whole
// packet, and every packet's comment parses.
func TestRecordKillDashNine(t *testing.T) {
	testenv.Require(t)
	dir := filepath.Join(t.TempDir(), "shed")
	p, pin, cfg := pinnedSetup(t, strictYAML+"record: {samples: 1000/s, dir: "+dir+", max_bytes: 1MiB}\n")
	run := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--pin-path", pin)
	f := startFlood(t, p, 20*time.Second)
	defer f.stop()
	time.Sleep(1500 * time.Millisecond)
	run.stop(t, syscall.SIGKILL)
	files, err := filepath.Glob(filepath.Join(dir, "shed-*.pcapng"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no pcapng files in %s: %v\n%s", dir, err, run.log)
	}
	total := 0
	for _, name := range files {
		n := readRecordFile(t, name)
		total += n
		out, err := exec.Command("tshark", "-r", name, "-T", "fields", "-e", "frame.comment").Output()
		if errors.Is(err, exec.ErrNotFound) {
			continue
		}
		// tshark exits 2 on a torn last block, having read the rest.
		if lines := strings.Fields(strings.ReplaceAll(string(out), " ", "_")); len(lines) != n {
			t.Errorf("%s: tshark read %d packets (%v), gopacket %d", name, len(lines), err, n)
		}
	}
	if total < 200 {
		t.Errorf("%d samples in %d files after 1.5 s of flood at 1000/s, want at least 200", total, len(files))
	}
}

// readRecordFile reads a pcapng file of samples to its end, or to a torn
// last block, checks each packet's comment, and returns the packets.
func readRecordFile(t *testing.T, name string) int {
	t.Helper()
	fh, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	r, err := pcapgo.NewNgReader(fh, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	n := 0
	for {
		_, _, opts, err := r.ReadPacketDataWithOptions()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n
		}
		if err != nil {
			t.Fatalf("%s: packet %d: %v", name, n+1, err)
		}
		if len(opts.Comments) != 1 {
			t.Fatalf("%s: packet %d has comments %q", name, n+1, opts.Comments)
		}
		if _, err := record.ParseSampleComment(opts.Comments[0]); err != nil {
			t.Fatal(err)
		}
		n++
	}
}

// TestRecordEventsRsyslog sends an episode's reports to a real rsyslogd
// (in the collector's namespace, on its loopback): rsyslog parses them as
// RFC 5424, its message without the structured data, tagged tierlimit,
// for the open, the summaries and the close.
func TestRecordEventsRsyslog(t *testing.T) {
	testenv.Require(t)
	testenv.RequireRsyslog(t)
	p, pin, cfg := pinnedSetup(t, strictYAML+"events: {syslog: udp://127.0.0.1:5514, summary_every: 1s}\n")
	rs := testenv.StartRsyslog(t, p.Coll, netip.MustParseAddrPort("127.0.0.1:5514"))
	run := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--pin-path", pin)
	f := startFlood(t, p, 3*time.Second)
	<-f.done
	if n, err := rs.WaitCount("shedding ended after", 1, time.Second, 10*time.Second); n != 1 || err != nil {
		t.Fatalf("rsyslog got %d closing reports (%v); agent log:\n%s", n, err, run.log)
	}
	out, err := os.ReadFile(rs.Out)
	if err != nil {
		t.Fatal(err)
	}
	var opens, summaries int
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, "shedding") {
			continue
		}
		if !strings.Contains(line, " tierlimit[") || strings.Contains(line, "shed@32473") {
			t.Errorf("rsyslog did not parse the report as RFC 5424 with structured data: %q", line)
		}
		switch {
		case strings.Contains(line, "shedding began on "+p.CollIf):
			t.Logf("rsyslog wrote: %s", line)
			opens++
		case strings.Contains(line, "top source groups by sampled sheds"):
			summaries++
		}
	}
	if opens != 1 || summaries < 1 {
		t.Errorf("rsyslog got %d openings and %d summaries, want 1 and at least 1:\n%s", opens, summaries, out)
	}
}

// recordCount is the packets in every record file under dir.
func recordCount(t *testing.T, dir string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "shed-*.pcapng"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		n += readRecordFile(t, f)
	}
	return n
}

// TestRecordReloadFile changes the record through the config file of a
// running `tierlimit run` under a flood: from samples: 0 to sampling into
// a dir, live; then to a dir under a file, which the agent refuses
// (counted in config_reloads_total{result="error"}), sampling on into the
// first dir.
func TestRecordReloadFile(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, strictYAML+"record: {samples: 0}\n")
	run := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--pin-path", pin)
	f := startFlood(t, p, 10*time.Second)
	defer f.stop()
	time.Sleep(time.Second)
	dir := filepath.Join(t.TempDir(), "shed")
	writeConfig(t, cfg, strictYAML+"record: {samples: 200/s, dir: "+dir+", max_bytes: 1MiB}\n")
	if !run.waitLog("shed record: reloaded", 5*time.Second) {
		t.Fatalf("no reload of the record; agent log:\n%s", run.log)
	}
	var n int
	if !waitFor(4*time.Second, func() bool { n = recordCount(t, dir); return n >= 100 }) {
		t.Fatalf("%d samples in %s after sampling was turned on, want 100", n, dir)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	writeConfig(t, cfg, strictYAML+"record: {samples: 200/s, dir: "+filepath.Join(file, "shed")+", max_bytes: 1MiB}\n")
	if !run.waitLog("record dir not usable", 5*time.Second) {
		t.Fatalf("the dir under a file was not refused; agent log:\n%s", run.log)
	}
	if got := sum(scrape(t, p.Coll), "tierlimit_config_reloads_total", "result=error"); got != 1 {
		t.Errorf("config_reloads_total{error} = %v, want 1", got)
	}
	n0 := recordCount(t, dir)
	if !waitFor(4*time.Second, func() bool { n = recordCount(t, dir); return n >= n0+100 }) {
		t.Errorf("%d samples in %s, then %d after the refused reload: want sampling on into it", n0, dir, n)
	}
}
