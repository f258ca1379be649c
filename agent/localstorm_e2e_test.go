package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// routeStorm adds n /32 routes (10.128.0.0/9) to ns's main table in one
// ip -batch, as a BGP session coming up does: more route messages than a
// netlink subscription's default buffer holds.
func routeStorm(t *testing.T, ns *testenv.NS, n int) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "route add 10.%d.%d.%d/32 dev lo\n", 128+i>>16&0x7f, i>>8&0xff, i&0xff)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := ns.Command(ctx, "ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -batch of %d routes: %v\n%s", n, err, out)
	}
}

// TestDestsLocalAfterRouteStorm (issue 35 B47): 3 storms of 20,000 route
// adds in the agent's namespace (each overflows a subscription of the
// default buffer) do not end following: an address added after them is
// counted, and tierlimit_local_dests counts the prefixes with it.
func TestDestsLocalAfterRouteStorm(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	a := startAgent(t, p, attach.XDPAuto, policy(t, 100000))
	if out, err := p.Coll.Command(context.Background(), "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}
	for range 3 {
		routeStorm(t, p.Coll, 20000)
		if err := p.Coll.Command(context.Background(), "ip", "route", "flush", "root", "10.128.0.0/9").Run(); err != nil {
			t.Fatal(err)
		}
	}
	vip := netip.MustParseAddr("192.0.2.201")
	routeOther(t, p, vip, netip.MustParseAddr("198.51.100.98"))
	testenv.AddAddr(t, p.Coll, "lo", netip.PrefixFrom(vip, 32))
	waitLocalPrefix(t, a, netip.PrefixFrom(vip, 32), true)
	if sel, _ := countSent(t, a, p, vip, 500); sel != 500 {
		t.Errorf("to an address added after the storms: %d of 500 selected", sel)
	}
	m := gather(t, a)
	if got, want := m.sum("tierlimit_local_dests"), len(a.LocalPrefixes()); got != float64(want) {
		t.Errorf("tierlimit_local_dests %v, want the %d local prefixes, the new address among them", got, want)
	}
	t.Logf("follow errors over the storms: %v", m.sum("tierlimit_follow_errors_total"))
}
