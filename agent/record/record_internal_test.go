package record

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

func testSample(i int) bpf.Sample {
	data := bytes.Repeat([]byte{byte(i)}, 100)
	return bpf.Sample{Mono: time.Duration(i) * time.Millisecond, Ifindex: 1 + i%2, Len: 300, Data: data,
		Tier: i % 4, Reason: bpf.Reason(i % bpf.NumReasons), Verdict: tiers.VerdictDrop, Severity: i % 8, Facility: -1,
		Group: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), 0}), 24)}
}

// readPcapng reads every packet of a pcapng file with its comments.
func readPcapng(t *testing.T, path string) (n int, comments []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for {
		_, _, opts, err := r.ReadPacketDataWithOptions()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n, comments
		}
		if err != nil {
			t.Fatalf("%s: packet %d: %v", path, n, err)
		}
		n++
		comments = append(comments, opts.Comments...)
	}
}

// TestPcapDir writes samples through rotation: every file parses, every
// packet carries its comment, and the directory stays within max_bytes,
// the oldest files removed first.
func TestPcapDir(t *testing.T) {
	dir := t.TempDir()
	const maxBytes = 64 << 10
	d, err := newPcapDir(dir, maxBytes, 256, func(i int) string { return "veth" + strconv.Itoa(i) })
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now()
	const total = 2000 // about 300 kB: several rotations
	for i := range total {
		s := testSample(i)
		if err := d.write(base.Add(s.Mono), s.Ifindex, s.Len, s.Data, SampleComment(s)); err != nil {
			t.Fatal(err)
		}
	}
	names, sizes, err := d.files()
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, s := range sizes {
		sum += s
	}
	if sum > maxBytes || len(names) < 2 {
		t.Errorf("%d files of %d bytes, want at least 2 within %d", len(names), sum, maxBytes)
	}
	var got int
	last := -1
	for _, n := range names {
		c, comments := readPcapng(t, filepath.Join(dir, n))
		if c != len(comments) {
			t.Errorf("%s: %d packets, %d comments", n, c, len(comments))
		}
		for _, cm := range comments {
			kv, err := ParseSampleComment(cm)
			if err != nil {
				t.Fatal(err)
			}
			g := netip.MustParsePrefix(kv["group"])
			i := int(g.Addr().As4()[2])
			if kv["reason"] != bpf.Reason(i%bpf.NumReasons).String() || kv["tier"] != strconv.Itoa(i%4) {
				t.Errorf("comment %q does not match its sample", cm)
			}
			last = i
		}
		got += c
	}
	// The newest samples are all there: the last file ends with the last.
	if last != (total-1)%256 || got < total/10 {
		t.Errorf("read %d packets, the last of group %d; want the newest, %d", got, last, (total-1)%256)
	}
	d.close()
	checkExternalReaders(t, filepath.Join(dir, names[len(names)-1]))
	if os.Getenv("TIERLIMIT_KEEP_PCAP") != "" {
		exec.Command("cp", filepath.Join(dir, names[len(names)-1]), os.Getenv("TIERLIMIT_KEEP_PCAP")).Run()
	}
}

// checkExternalReaders reads a file with tcpdump and tshark when they are
// installed (deploy/vagrant/provision.sh installs both): each must read
// every packet, and tshark must show each packet's comment.
func checkExternalReaders(t *testing.T, path string) {
	t.Helper()
	n, comments := readPcapng(t, path)
	if out, err := exec.Command("tcpdump", "-nr", path).Output(); err == nil {
		// One line a packet, and hex dump lines (tab-indented) for
		// the test's made-up frames.
		got := 0
		for _, l := range strings.Split(string(out), "\n") {
			if l != "" && l[0] != '\t' {
				got++
			}
		}
		if got != n {
			t.Errorf("tcpdump -r %s: %d packets, want %d", path, got, n)
		}
	} else if !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("tcpdump -r %s: %v", path, err)
	}
	out, err := exec.Command("tshark", "-r", path, "-T", "fields", "-e", "frame.comment").Output()
	if errors.Is(err, exec.ErrNotFound) {
		t.Logf("no tshark here: its check skipped")
		return
	}
	if err != nil {
		t.Fatalf("tshark -r %s: %v", path, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != n || lines[0] != comments[0] || lines[n-1] != comments[n-1] {
		t.Errorf("tshark: %d comments (first %q), want %d (%q)", len(lines), lines[0], n, comments[0])
	}
}

// TestPcapDirTornTail: a file cut inside its last packet (an agent killed
// mid-write) still yields every whole packet before the cut.
func TestPcapDirTornTail(t *testing.T) {
	dir := t.TempDir()
	d, err := newPcapDir(dir, 1<<20, 256, func(int) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		s := testSample(i)
		if err := d.write(time.Now(), 1, s.Len, s.Data, SampleComment(s)); err != nil {
			t.Fatal(err)
		}
	}
	path := d.f.Name()
	d.close()
	fi, _ := os.Stat(path)
	if err := os.Truncate(path, fi.Size()-37); err != nil {
		t.Fatal(err)
	}
	if n, _ := readPcapng(t, path); n != 9 {
		t.Errorf("torn file: %d packets read, want the 9 whole ones", n)
	}
	// tshark says the file was cut short (exit 2) and reads the rest.
	out, err := exec.Command("tshark", "-r", path, "-T", "fields", "-e", "frame.comment").Output()
	if errors.Is(err, exec.ErrNotFound) {
		return
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 9 {
		t.Errorf("tshark on the torn file (%v): %d packets, want 9: %s", err, len(lines), out)
	}
}

// TestPcapDirReadOnly: a dir that refuses files makes write fail (the
// recorder counts the sample lost) and recovers once it takes them.
func TestPcapDirReadOnly(t *testing.T) {
	dir := t.TempDir()
	d, err := newPcapDir(dir, 1<<20, 256, func(int) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	rec := &Recorder{log: slog.New(slog.DiscardHandler), dir: d, groups: map[netip.Prefix]uint64{}}
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	// root ignores permissions: make the path a file instead.
	sub := filepath.Join(dir, "sub")
	os.Chmod(dir, 0o700)
	if err := os.WriteFile(sub, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d.dir = sub
	rec.keep(testSample(1))
	if rec.lost.Load() != 1 || rec.written.Load() != 0 {
		t.Errorf("into a file as dir: lost %d written %d, want 1 0", rec.lost.Load(), rec.written.Load())
	}
	d.dir = dir
	rec.keep(testSample(2))
	if rec.lost.Load() != 1 || rec.written.Load() != 1 {
		t.Errorf("dir back: lost %d written %d, want 1 1", rec.lost.Load(), rec.written.Load())
	}
	if len(rec.Recent()) != 2 {
		t.Errorf("in memory: %d samples, want 2", len(rec.Recent()))
	}
}

func TestSampleComment(t *testing.T) {
	s := testSample(3)
	s.Tier, s.Severity, s.Verdict = -1, -1, tiers.VerdictWouldDrop
	c := SampleComment(s)
	want := "tier=- reason=fragment severity=- class=normal group=10.0.3.0/24 verdict=would_drop dry_run=true"
	if c != want {
		t.Errorf("comment %q, want %q", c, want)
	}
	s = testSample(6)
	if c := SampleComment(s); !strings.HasPrefix(c, "tier=2 reason=shed_first severity=info ") {
		t.Errorf("comment %q", c)
	}
	// Format 2: the facility, the pass probability and its weight.
	s.Facility, s.Format, s.Pass = 4, bpf.SampleFormat, 1<<30
	kv, err := ParseSampleComment(SampleComment(s))
	if err != nil || kv["facility"] != "auth" || kv["pass"] != "0.25" || kv["weight"] != "4" {
		t.Errorf("comment %q: %v, %v", SampleComment(s), kv, err)
	}
	if _, err := ParseSampleComment("tier=1 reason"); err == nil {
		t.Error("a broken comment parsed")
	}
}

// TestEpisodeTicks drives the tracker with counters: an episode opens at
// the first window with a shed packet, sums by tier and reason, reports a
// summary every summary_every, and closes after QuietWindows quiet ones.
func TestEpisodeTicks(t *testing.T) {
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := tiers.Default()
	p.Events = tiers.Events{Network: "udp", Addr: ln.LocalAddr().String(), SummaryEvery: 3 * time.Second}
	state := filepath.Join(t.TempDir(), "episode.json")
	e := newEpisodes(slog.New(slog.DiscardHandler), nil, nil, p, func() []string { return []string{"veth0"} }, state)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.send.run(ctx)

	var st bpf.Stats
	now := time.Now()
	step := func(drops, over uint64) {
		st.Selected[3][tiers.VerdictDrop].Packets += drops
		st.Selected[0][tiers.VerdictPass].Packets += 1000
		st.OverBudget[tiers.VerdictDrop].Packets += over
		now = now.Add(time.Second)
		e.tick(now, st)
	}
	step(0, 0) // first read
	step(0, 0)
	if e.Current().ID != 0 {
		t.Fatal("an episode opened without shedding")
	}
	step(10, 5) // opens
	for range 5 {
		step(10, 0)
	}
	for range QuietWindows - 1 {
		step(0, 0)
	}
	if c := e.Current(); !c.Open || c.Shed != 65 || c.ByTier["3"] != 60 || c.ByReason["over_budget"] != 5 || c.ByReason["tier"] != 60 {
		t.Errorf("open episode %+v", c)
	}
	step(0, 0) // the third quiet window closes it
	c := e.Current()
	if c.Open || c.Duration(now) != 8*time.Second {
		t.Errorf("episode %+v, want closed after 8 s", c)
	}
	saved, err := ReadEpisode(state)
	if err != nil || saved.ID != 1 || saved.Open || saved.Shed != 65 {
		t.Errorf("state file: %+v, %v", saved, err)
	}
	// open, summaries at +3 s and +6 s, close.
	var kinds []string
	buf := make([]byte, 4096)
	for len(kinds) < 4 {
		ln.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := ln.ReadFrom(buf)
		if err != nil {
			t.Fatalf("after %v: %v", kinds, err)
		}
		m, err := parseRFC5424(string(buf[:n]))
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, m.params["event"])
		if m.params["episode"] != "1" {
			t.Errorf("report %q: episode %q", buf[:n], m.params["episode"])
		}
	}
	if fmt.Sprint(kinds) != "[open summary summary close]" {
		t.Errorf("reports %v, want open, 2 summaries, close", kinds)
	}
	// A UDP report counts once no ICMP unreachable came for eventICMPWait.
	waitUntil(t, func() bool { return e.send.sent.Load()+e.send.errs.Load() >= 4 })
	if e.send.sent.Load() != 4 || e.send.errs.Load() != 0 {
		t.Errorf("sent %d errors %d", e.send.sent.Load(), e.send.errs.Load())
	}
}

// rfc5424 is a parsed message: header fields and the shed@32473 params.
type rfc5424 struct {
	pri    int
	msgID  string
	params map[string]string
	msg    string
}

// parseRFC5424 parses what formatRFC5424 writes, strictly enough to catch
// a broken header or SD element.
func parseRFC5424(s string) (rfc5424, error) {
	var m rfc5424
	if !strings.HasPrefix(s, "<") {
		return m, fmt.Errorf("no PRI: %q", s)
	}
	end := strings.IndexByte(s, '>')
	pri, err := strconv.Atoi(s[1:end])
	if err != nil {
		return m, fmt.Errorf("PRI: %q", s)
	}
	m.pri = pri
	f := strings.SplitN(s[end+1:], " ", 7)
	if len(f) != 7 || f[0] != "1" || f[3] != "tierlimit" {
		return m, fmt.Errorf("header: %q", s)
	}
	if _, err := time.Parse(time.RFC3339Nano, f[1]); err != nil {
		return m, fmt.Errorf("timestamp: %v", err)
	}
	m.msgID = f[5]
	sd := f[6]
	if !strings.HasPrefix(sd, "["+sdID) {
		return m, fmt.Errorf("SD: %q", sd)
	}
	m.params = map[string]string{}
	i := len("[" + sdID)
	for sd[i] == ' ' {
		eq := strings.IndexByte(sd[i:], '=') + i
		name := sd[i+1 : eq]
		var v strings.Builder
		j := eq + 2
		for ; sd[j] != '"'; j++ {
			if sd[j] == '\\' {
				j++
			}
			v.WriteByte(sd[j])
		}
		m.params[name] = v.String()
		i = j + 1
	}
	if sd[i] != ']' || sd[i+1] != ' ' {
		return m, fmt.Errorf("SD end: %q", sd[i:])
	}
	m.msg = sd[i+2:]
	return m, nil
}

// TestEventSenderTCP: reports reach a TCP listener octet-counted; with the
// destination gone they count errors without blocking, and resume when it
// returns.
func TestEventSenderTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	e := newEventSender(slog.New(slog.DiscardHandler), "tcp", addr, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.run(ctx)
	msg := formatRFC5424(5, time.Now(), "host", "shed-summary", []sdParam{{"event", "summary"}, {"top", `a"b]c\d`}}, "hello world")
	e.send(msg)
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	lenText, err := r.ReadString(' ')
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(lenText))
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil || !bytes.Equal(body, msg) {
		t.Fatalf("framed %q (%v), want %q", body, err, msg)
	}
	if m, err := parseRFC5424(string(body)); err != nil || m.params["top"] != `a"b]c\d` || m.msg != "hello world" || m.pri != 37 {
		t.Errorf("parsed %+v, %v", m, err)
	}
	c.Close()
	ln.Close()
	// Gone: the queue never blocks, every report is sent or counted.
	start := time.Now()
	for range 3 * eventQueue {
		e.send(msg)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("sending to a dead destination blocked for %v", d)
	}
	waitUntil(t, func() bool { return e.errs.Load() >= 2*eventQueue && len(e.q) == 0 })
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	defer ln.Close()
	sent := e.sent.Load()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, c)
		}
	}()
	waitUntil(t, func() bool {
		e.send(msg)
		return e.sent.Load() > sent+1
	})
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPayloadSeverity: the agent reads the <PRI> of a sample the program
// did not (no severity block), and only of a whole UDP syslog frame.
func TestPayloadSeverity(t *testing.T) {
	frame := func(payload string) []byte {
		buf := gopacket.NewSerializeBuffer()
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{192, 0, 2, 1}, DstIP: net.IP{192, 0, 2, 2}}
		udp := &layers.UDP{SrcPort: 40000, DstPort: 514}
		udp.SetNetworkLayerForChecksum(ip)
		err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
			&layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4},
			ip, udp, gopacket.Payload(payload))
		if err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for _, c := range []struct {
		frame []byte
		want  int
	}{
		{frame("<134>1 - - - - - - info"), 6},
		{frame("<11>Jan  1 00:00:00 host app: err"), 3},
		{frame("no pri"), -1},
		{frame("<134>1 x")[:44], -1}, // cut inside the UDP header
	} {
		if got := payloadSeverity(c.frame); got != c.want {
			t.Errorf("payloadSeverity(%q) = %d, want %d", c.frame, got, c.want)
		}
	}
}

// TestEpisodeMaxFollowsAuto: the max that `max: auto` applies between
// reloads (SetMax, from the agent's apply) is the one the next episode reports;
// an open episode keeps the max it opened with.
func TestEpisodeMaxFollowsAuto(t *testing.T) {
	p := tiers.Default()
	p.Max = 2000
	e := newEpisodes(slog.New(slog.DiscardHandler), nil, nil, p, func() []string { return []string{"veth0"} }, filepath.Join(t.TempDir(), "episode.json"))
	var st bpf.Stats
	now := time.Now()
	step := func(drops uint64) {
		st.Selected[3][tiers.VerdictDrop].Packets += drops
		now = now.Add(time.Second)
		e.tick(now, st)
	}
	step(0) // first read
	e.SetMax(p.WithMax(1260))
	step(10) // opens at the applied max
	e.SetMax(p.WithMax(882))
	if got := e.Current().Max; got != 1260 {
		t.Errorf("open episode's max %d, want 1260 (the max it opened with)", got)
	}
	for range QuietWindows {
		step(0)
	}
	step(10) // the next episode
	if c := e.Current(); !c.Open || c.Max != 882 {
		t.Errorf("next episode %+v, want open at max 882", c)
	}
}

// TestEpisodeMaxFleet (issue 43 B78): under a fleet the limiter sheds
// against fleet.max, and the episode's reports and state file give that
// max, named "fleet.max", not the policy's local max; in the fallback
// (fleet off) they give the local max again, unnamed.
func TestEpisodeMaxFleet(t *testing.T) {
	p := tiers.Default()
	p.Max = 100000
	p.Fleet = &tiers.Fleet{Name: "f", Store: "redis://127.0.0.1:6379", Max: 1000, Report: 100 * time.Millisecond, TTL: 3 * time.Second}
	e := newEpisodes(slog.New(slog.DiscardHandler), nil, nil, p, func() []string { return []string{"veth0"} }, filepath.Join(t.TempDir(), "episode.json"))
	var st bpf.Stats
	now := time.Now()
	step := func(drops uint64) {
		st.Selected[3][tiers.VerdictDrop].Packets += drops
		now = now.Add(time.Second)
		e.tick(now, st)
	}
	step(0)
	step(10)
	c := e.Current()
	if !c.Open || c.Max != 1000 || c.MaxOf != "fleet.max" {
		t.Fatalf("episode under a fleet: max %d of %q, want 1000 of fleet.max", c.Max, c.MaxOf)
	}
	params, msg := reportParams("open", c, now)
	if !strings.Contains(msg, "max 1000 per window (fleet.max)") {
		t.Errorf("open report %q lacks the fleet's max", msg)
	}
	var sawMax, sawOf bool
	for _, q := range params {
		sawMax = sawMax || q.name == "max" && q.value == "1000"
		sawOf = sawOf || q.name == "max_of" && q.value == "fleet.max"
	}
	if !sawMax || !sawOf {
		t.Errorf("open report's structured data %v lacks max=1000 max_of=fleet.max", params)
	}
	saved, err := ReadEpisode(e.state)
	if err != nil || saved.Max != 1000 || saved.MaxOf != "fleet.max" {
		t.Errorf("state file: %+v, %v; want max 1000 of fleet.max", saved, err)
	}
	e.SetMax(p.FleetFallbackPolicy(4)) // the fallback's share: 250, the local max
	for range QuietWindows {
		step(0)
	}
	step(10)
	if c := e.Current(); c.Max != 250 || c.MaxOf != "" {
		t.Errorf("episode in the fallback: max %d of %q, want 250, the local max", c.Max, c.MaxOf)
	}
}
