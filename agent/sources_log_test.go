package agent

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sysutil"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestSourceLogRateLimited puts 8 groups over budget (by BPF_PROG_TEST_RUN)
// and checks the log: one line per group and window, at most
// sourceLogBurst at once, the rest held back and counted, nothing again for
// a group until a later window.
func TestSourceLogRateLimited(t *testing.T) {
	testenv.Require(t)
	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := tiers.Default()
	p.Window, p.Max = time.Hour, 1000
	p.Sources = tiers.Sources{BudgetPackets: 2, PrefixV4: 32, PrefixV6: 64}
	tab, err := tiers.Compile(p, l.Tick())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(context.Background(), tab); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	a := &Agent{lim: l, log: slog.New(slog.NewTextHandler(&buf, nil))}
	sl := newSourceLogger(l)
	over := func(hosts int) { sendOverBudget(t, l, hosts) }
	lines := func() []string { return takeLines(&buf) }

	now := time.Now()
	over(8)
	if err := sl.check(a, now); err != nil {
		t.Fatal(err)
	}
	if got := lines(); len(got) != sourceLogBurst {
		t.Fatalf("first check: %d lines, want %d:\n%s", len(got), sourceLogBurst, strings.Join(got, "\n"))
	}
	// Three seconds on, the three groups held back get their lines; the
	// first says how many were held back before it.
	if err := sl.check(a, now.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	got := lines()
	if len(got) != 3 || !strings.Contains(got[0], "held_back=3") {
		t.Fatalf("second check: want 3 lines, the first with held_back=3:\n%s", strings.Join(got, "\n"))
	}
	// Still over in the same window: no news.
	over(8)
	if err := sl.check(a, now.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := lines(); len(got) != 0 {
		t.Fatalf("same window again: %d lines:\n%s", len(got), strings.Join(got, "\n"))
	}
	// A new window: the group going over again is news.
	expireWindow(t, l, p.Window)
	over(1)
	if err := sl.check(a, now.Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	got = lines()
	if len(got) != 1 || !strings.Contains(got[0], "group="+netip.MustParseAddr("192.0.2.1").String()+"/32") {
		t.Fatalf("next window: want one line for 192.0.2.1/32, got %d:\n%s", len(got), strings.Join(got, "\n"))
	}
}

// sendOverBudget runs three syslog datagrams from each of hosts sources,
// 192.0.2.1 on, through l's program.
func sendOverBudget(t *testing.T, l *bpf.Limiter, hosts int) {
	for h := range hosts {
		src := net.IPv4(192, 0, 2, byte(h+1))
		frame := testenv.Serialize(t, testenv.Eth(layers.EthernetTypeIPv4), testenv.IPv4(src, testenv.Dst4, layers.IPProtocolUDP), testenv.UDP(514), testenv.Syslog())
		if _, err := l.Program().Run(&ebpf.RunOptions{Data: frame, Repeat: 3}); err != nil {
			t.Fatal(err)
		}
	}
}

// takeLines returns the lines logged into buf and empties it.
func takeLines(buf *bytes.Buffer) []string {
	s := strings.TrimSpace(buf.String())
	buf.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// expireWindow moves l's window start back past window, so that the next
// packet opens a window.
func expireWindow(t *testing.T, l *bpf.Limiter, window time.Duration) {
	w, err := l.Window()
	if err != nil {
		t.Fatal(err)
	}
	mono, err := sysutil.Monotonic()
	if err != nil {
		t.Fatal(err)
	}
	w.StartNs, w.StartJiffies = mono-uint64(window)-uint64(time.Millisecond), 0 // expired: the next packet opens a window
	if err := l.SetWindow(w); err != nil {
		t.Fatal(err)
	}
}
