package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// Issue 25 §2: a super-packet is charged as the datagrams it carries in the
// source budget, the severity debt and the saturated window's overflow,
// and on an interface re-created under the agent. Each test sends real
// UDP_SEGMENT super-packets through a veth to the limiter in generic mode.

// gsoPolicy parses an ordinal policy (whose windows these tests count
// exactly) from YAML.
func gsoPolicy(t *testing.T, y string) tiers.Policy {
	t.Helper()
	p, err := tiers.ParseYAML([]byte("window: 1h\nshape: ordinal\nselect: [{proto: udp, ports: [514]}]\n" + y))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sendSegmentedPayload is sendSegmented with every segment of each write
// starting with head (a syslog <PRI>).
func sendSegmentedPayload(dst netip.AddrPort, segment, count, size int, head string) (int, error) {
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = 'x'
	}
	for off := 0; off < size; off += segment {
		copy(buf[off:], head)
	}
	return writeSegmented(dst, segment, count, buf)
}

// gsoSend sends count super-packets of segs 100-byte datagrams, each
// starting with head, from the pair's sender to dst, and waits until the
// receiver is quiet.
func gsoSend(t *testing.T, p *testenv.Pair, rx *testenv.Receiver, dst netip.AddrPort, segs, count int, head string) {
	t.Helper()
	var sent int
	err := p.Send.Do(func() (err error) {
		sent, err = sendSegmentedPayload(dst, 100, count, 100*segs, head)
		return err
	})
	if err != nil || sent != count {
		t.Fatalf("sent %d of %d super-packets: %v", sent, count, err)
	}
	rx.WaitQuiet(500*time.Millisecond, 10*time.Second)
}

// gsoSetup starts the agent in generic mode on the pair with policy pol,
// with a receiver on udp/514 and the neighbour resolved.
func gsoSetup(t *testing.T, pol tiers.Policy) (*testenv.Pair, *agent.Agent, *testenv.Receiver, netip.AddrPort) {
	t.Helper()
	testenv.Require(t)
	p := newPair(t)
	a := startAgent(t, p, attach.XDPGeneric, pol)
	if att := testenv.XDP(t, p.Coll, p.CollIf); att.Mode != "generic" {
		t.Fatalf("limiter runs in %q mode on %s, want generic", att.Mode, p.CollIf)
	}
	dst := netip.AddrPortFrom(p.CollAddr, 514)
	rx := testenv.NewReceiver(t, p.Coll, dst)
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")
	return p, a, rx, dst
}

// TestSuperPacketsSourceBudget: one source with a budget of 50 sends 640
// datagrams in 64 super-packets of 10. The first 5 are its budget (50 in
// the window); the other 590 are over budget, counted as such, and not in
// the window. Charged 1 per super-packet, the source stayed within budget.
func TestSuperPacketsSourceBudget(t *testing.T) {
	pol := gsoPolicy(t, "max: 1000\ntiers: [{at: 1000%, drop: 100%}]\nsources: {budget: 50}\n")
	p, a, rx, dst := gsoSetup(t, pol)
	before := gather(t, a)
	gsoSend(t, p, rx, dst, 10, 64, "<134>")
	after := gather(t, a)
	over := after.sum("tierlimit_source_over_budget_packets_total") - before.sum("tierlimit_source_over_budget_packets_total")
	_, got := rx.Counts()
	t.Logf("640 datagrams from one source in 64 super-packets: over budget %.0f, window n %.0f, received %d",
		over, after["tierlimit_window_packets"], got)
	if over != 590 || after["tierlimit_window_packets"] != 50 {
		t.Errorf("over budget %.0f, window n %.0f; want 590 and 50", over, after["tierlimit_window_packets"])
	}
}

// TestSuperPacketsDebt: a forged <10> (user.crit, protected) flood of 2560
// datagrams in super-packets of 10, with max 1000, one tier at 10% that
// drops everything and a protect budget of 4% (40). Super-packets pass
// whole below n = 100 (90 datagrams), then protection passes 40 datagrams
// more, not 40 super-packets.
func TestSuperPacketsDebt(t *testing.T) {
	pol := gsoPolicy(t, "max: 1000\ntiers: [{at: 10%, drop: 100%}]\nseverity: {protect: [crit], protect_budget: 4%}\n")
	p, a, rx, dst := gsoSetup(t, pol)
	before := gather(t, a)
	gsoSend(t, p, rx, dst, 10, 256, "<10>")
	after := gather(t, a)
	prot := after["tierlimit_protected_passed_packets_total"] - before["tierlimit_protected_passed_packets_total"]
	_, got := rx.Counts()
	t.Logf("2560 protected datagrams in 256 super-packets: received %d, protected passes %.0f, debt %.0f",
		got, prot, after["tierlimit_drop_debt_packets"])
	if got < 90 || got > 99+40 {
		t.Errorf("socket received %d datagrams, want 90..139 (99 below the tier, then the protect budget, 40)", got)
	}
	if prot < 31 || prot > 40 || after["tierlimit_drop_debt_packets"] > 40 {
		t.Errorf("protected passes %.0f, debt %.0f: want 31..40 and at most 40", prot, after["tierlimit_drop_debt_packets"])
	}
}

// TestSuperPacketsAfterRaise: 1000 datagrams in super-packets fill a window
// of max 100 far past saturation (the shared count stops near 100, the rest
// is in the CPUs' overflow). A reload raises max to 1000, so the window's
// 1000 datagrams are now at its last tier (100%, drop 100%): the next
// super-packets must be judged there (the overflow sum), not at the
// shared count's tier 0.
func TestSuperPacketsAfterRaise(t *testing.T) {
	const tiersYAML = "tiers: [{at: 50%, drop: 0%}, {at: 100%, drop: 100%}]\n"
	p, a, rx, dst := gsoSetup(t, gsoPolicy(t, "max: 100\n"+tiersYAML))
	gsoSend(t, p, rx, dst, 10, 100, "<134>")
	_, before := rx.Counts()
	if err := a.Reload(context.Background(), gsoPolicy(t, "max: 1000\n"+tiersYAML)); err != nil {
		t.Fatal(err)
	}
	gsoSend(t, p, rx, dst, 10, 10, "<134>")
	_, after := rx.Counts()
	m := gather(t, a)
	t.Logf("window n %.0f; received %d of the first 1000, %d of the 100 after the raise", m["tierlimit_window_packets"], before, after-before)
	if before < 40 || before > 99 {
		t.Errorf("received %d of the first 1000, want 40..99 (below max 100)", before)
	}
	if after != before {
		t.Errorf("received %d of 100 datagrams sent after the raise, want 0: the window holds 1000 already", after-before)
	}
}

// vethToSender makes a veth name in the collector's namespace whose peer is
// in the sender's, addressed 10.<x>.<y>.1/30 and .2, both up, and returns
// the collector side's address.
func vethToSender(t *testing.T, p *testenv.Pair, name string, x, y byte) netip.Addr {
	t.Helper()
	peer := "tp" + sandbox.RandHex(5)
	f, err := os.Open(p.Send.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = p.Coll.Do(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer, PeerNamespace: netlink.NsFd(int(f.Fd()))})
	})
	if err != nil {
		t.Fatalf("veth %s: %v", name, err)
	}
	coll := netip.AddrFrom4([4]byte{10, x, y, 1})
	ipIn(t, p.Coll, "addr", "add", coll.String()+"/30", "dev", name)
	ipIn(t, p.Coll, "link", "set", name, "up")
	ipIn(t, p.Send, "addr", "add", fmt.Sprintf("10.%d.%d.2/30", x, y), "dev", peer)
	ipIn(t, p.Send, "link", "set", peer, "up")
	return coll
}

// TestSuperPacketsReattached: an interface deleted and made again under a
// watching agent in generic mode gets the limiter back, and its
// super-packets count as their datagrams there too (the generic-mode gate
// follows the new ifindex).
func TestSuperPacketsReattached(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	name := "tlgs" + sandbox.RandHex(3)
	const x, y = 201, 7 // the pair's namespaces are the test's own
	vethToSender(t, p, name, x, y)
	logs := &testenv.SyncBuffer{}
	cfg := agent.Config{XDPMode: attach.XDPGeneric, Interfaces: []string{name}, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	a, err := newAgent(p, cfg, issuePolicy(t))
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Watch(ctx, 20*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done; a.Close() })
	ipIn(t, p.Coll, "link", "del", name)
	waitLog(t, logs, "limiter no longer attached")
	coll := vethToSender(t, p, name, x, y)
	waitLog(t, logs, "interface re-created: limiter attached to it")
	// The re-created veth's address is new: the rules' dests: local
	// follows it through netlink, and until the agent has it, datagrams to
	// it are not this host's and pass uncounted (docs/design.md §2).
	waitLocalPrefix(t, a, netip.PrefixFrom(coll, 32), true)
	if att := testenv.XDP(t, p.Coll, name); att.Mode != "generic" {
		t.Fatalf("limiter runs in %q mode on the re-created %s, want generic", att.Mode, name)
	}
	dst := netip.AddrPortFrom(coll, 514)
	rx := testenv.NewReceiver(t, p.Coll, dst)
	ping(t, p.Send, coll.String(), 1, "0.2")
	before := gather(t, a)
	gsoSend(t, p, rx, dst, 10, 30, "<134>")
	after := gather(t, a)
	counted := after.sum("tierlimit_selected_packets_total") - before.sum("tierlimit_selected_packets_total")
	t.Logf("300 datagrams in 30 super-packets on the re-created interface: counted %.0f", counted)
	if counted != 300 {
		t.Errorf("counted %.0f datagrams, want 300", counted)
	}
}
