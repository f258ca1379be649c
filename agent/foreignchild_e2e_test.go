package agent_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestForeignMacvlanWarned (issue 35 B55): a macvlan child of the
// attached NIC moved into another namespace (a collector's container that
// keeps its senders' addresses) is warned of at start, with its MAC: the
// agent cannot read its addresses, so dests: local does not count them. A
// NIC without such a child gets no warning.
func TestForeignMacvlanWarned(t *testing.T) {
	testenv.Require(t)
	start := func(p *testenv.Pair) string {
		var log testenv.SyncBuffer
		a, err := newAgent(p, agent.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}, policy(t, 100000))
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		return log.String()
	}
	plain := newPair(t)
	if out := start(plain); strings.Contains(out, "another network namespace") {
		t.Errorf("warned without a child:\n%s", out)
	}

	p := newPair(t)
	ctr := testenv.NewNS(t)
	ctx := context.Background()
	if out, err := p.Coll.Command(ctx, "ip", "link", "add", "tlmv0", "link", p.CollIf, "type", "macvlan", "mode", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("macvlan: %v\n%s", err, out)
	}
	var mac net.HardwareAddr
	if err := p.Coll.Do(func() error {
		l, err := netlink.LinkByName("tlmv0")
		if err != nil {
			return err
		}
		mac = l.Attrs().HardwareAddr
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := p.Coll.Command(ctx, "ip", "link", "set", "tlmv0", "netns", ctr.Path, "up").CombinedOutput(); err != nil {
		t.Fatalf("move the macvlan: %v\n%s", err, out)
	}
	out := start(p)
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "another network namespace receives through this interface") ||
		!strings.Contains(out, "child_mac="+mac.String()) {
		t.Errorf("no warning of the macvlan %s in another namespace:\n%s", mac, out)
	}
}
