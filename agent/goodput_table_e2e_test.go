package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestGoodputTable measures docs/operations.md's table "Goodput behind tierlimit,
// measured": issue 22's experiment with a collector of C datagrams/s and
// each thing in front of it, on a fresh veth pair each. It is a
// measurement, not a check (TestGoodputSmooth and TestGoodputAutoMax
// check): it runs only with TIERLIMIT_GOODPUT_TABLE=C.
func TestGoodputTable(t *testing.T) {
	v := os.Getenv("TIERLIMIT_GOODPUT_TABLE")
	if v == "" {
		t.Skip("a measurement for docs/operations.md: TIERLIMIT_GOODPUT_TABLE=C (the collector's datagrams/s) runs it")
	}
	testenv.Require(t)
	c, err := strconv.Atoi(v)
	if err != nil || c < 100 || c > 5000 {
		t.Fatalf("TIERLIMIT_GOODPUT_TABLE=%q: want the collector's datagrams/s, 100..5000", v)
	}
	pass := int(0.88 * float64(c)) // what the default tiers pass of max = C under a flood
	rows := []goodputRow{
		{name: "nothing"},
		{name: fmt.Sprintf("nftables `limit rate over %d/second drop`", pass), nft: fmt.Sprintf("udp dport 514 limit rate over %d/second drop", pass)},
		{name: fmt.Sprintf("tierlimit `max: %d`, `shape: ordinal`", c), pol: fmt.Sprint(c) + "\nshape: ordinal"},
		{name: fmt.Sprintf("tierlimit `max: %d`, `shape: smooth`", c), pol: fmt.Sprint(c) + "\nshape: smooth"},
		{name: fmt.Sprintf("tierlimit `max: auto` from %d, `shape: smooth`", 2*c), pol: fmt.Sprintf("auto\nauto: {start: %d}\nshape: smooth", 2*c), auto: true},
	}
	var table []string
	for _, row := range rows {
		line := row.measure(t, c)
		t.Log(line)
		table = append(table, line)
	}
	t.Logf("C = %d/s, flood %d/s of %d-byte lines, default SO_RCVBUF, measured over 5 s:\n| in front of the collector | XDP passed | the application read | socket drops |\n|---|---|---|---|\n%s",
		c, 10*c, goodputLine, strings.Join(table, "\n"))
}

// goodputRow is one row of TestGoodputTable: what is in front of the
// collector.
type goodputRow struct {
	name string
	pol  string // the policy's max line and more; "" runs no agent
	nft  string // an nftables input chain rule in the collector's namespace
	auto bool
}

// measure runs the row on a fresh pair with a collector of c datagrams/s
// and returns its table line.
func (row goodputRow) measure(t *testing.T, c int) string {
	t.Helper()
	p := newPair(t)
	var pol *tiers.Policy
	if row.pol != "" {
		q, err := tiers.ParseYAML(fmt.Appendf(nil, "window: 1s\nmax: %s\nselect: [{proto: udp, ports: [514]}]\n", row.pol))
		if err != nil {
			t.Fatal(err)
		}
		pol = &q
	}
	r := startGoodputRigC(t, p, p.Coll, netip.AddrPortFrom(p.CollAddr, 514), pol, c)
	if row.nft != "" {
		nft(t, p.Coll, "add table inet tltest", "add chain inet tltest in { type filter hook input priority 0; }", "add rule inet tltest in "+row.nft)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	warm := 3 * time.Second
	if row.auto {
		var src automax.DropSource
		if err := p.Coll.Do(func() (err error) {
			src, err = automax.OpenDropSource(false)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		am, err := r.a.StartAutoMax(ctx, *pol, src)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			var ms []string
			for _, w := range am.History() {
				ms = append(ms, fmt.Sprint(w.Max))
			}
			t.Logf("auto: max by window %s", strings.Join(ms, " "))
		}()
		warm = 10 * time.Second // the last 5 of 15 windows
	}
	r.flood(ctx, warm+7*time.Second)
	r.wait(warm)
	g := r.measure(5 * time.Second)
	cancel()
	<-r.sendErr
	read, drops := float64(g.read)/g.secs, float64(g.sockDrops)/g.secs
	reached := float64(g.read + g.sockDrops) // what reached the socket, in the steady state
	passed := "–"
	if pol != nil {
		passed = fmt.Sprintf("%.0f/s", g.passed/g.secs)
		reached = g.passed
	}
	return fmt.Sprintf("| %s | %s | %.0f/s (%.0f%% of %d/s) | %.0f/s (%.0f%% of what reached it) |",
		row.name, passed, read, 100*read/float64(c), c, drops, 100*float64(g.sockDrops)/max(1, reached))
}

func nft(t *testing.T, ns *testenv.NS, cmds ...string) {
	t.Helper()
	for _, cmd := range cmds {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := ns.Command(ctx, "nft", cmd).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("nft %s in %s: %v\n%s", cmd, ns.Name, err, out)
		}
	}
}
