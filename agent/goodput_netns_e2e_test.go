package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// Addresses of the pod link (RFC 5737 TEST-NET-3): the agent's namespace
// routes 203.0.113.0/24 to the pod's.
var (
	podRouter = netip.MustParseAddr("203.0.113.1")
	podAddr   = netip.MustParseAddr("203.0.113.2")
)

// routeToPod makes pod a namespace behind the pair's collector side, as a
// container or pod behind its host: a second veth from p.Coll into pod,
// p.Coll forwarding, and the sender's route to the pod through p.Coll. The
// veth goes with the namespaces.
func routeToPod(t *testing.T, p *testenv.Pair, pod *testenv.NS) {
	t.Helper()
	id := sandbox.RandHex(3)
	host, peer := "tlh"+id, "tlp"+id
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range []struct {
		ns   *testenv.NS
		args string
	}{
		{p.Coll, "ip link add " + host + " type veth peer name " + peer},
		{p.Coll, "ip link set " + peer + " netns " + pod.Name},
		{p.Coll, "ip addr add " + podRouter.String() + "/24 dev " + host},
		{p.Coll, "ip link set " + host + " up"},
		{pod, "ip addr add " + podAddr.String() + "/24 dev " + peer},
		{pod, "ip link set " + peer + " up"},
		{pod, "ip route add default via " + podRouter.String()},
		{p.Send, "ip route add 203.0.113.0/24 via " + p.CollAddr.String()},
	} {
		f := strings.Fields(c.args)
		if out, err := c.ns.Command(ctx, f[0], f[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s in %s: %v\n%s", c.args, c.ns.Name, err, out)
		}
	}
	// Forwarding on in the agent's namespace: /proc/sys/net is the opening
	// thread's namespace's (no sysctl binary needed: a fresh Debian root
	// has none).
	if err := p.Coll.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
	}); err != nil {
		t.Fatalf("ip_forward in %s: %v", p.Coll.Name, err)
	}
}

// TestGoodputAutoMaxNetNS is TestGoodputAutoMax with the collector in a
// pod: a network namespace of its own, routed behind the agent's, where
// the agent's XDP sees its traffic on the way in. In the agent's namespace
// there is no collector socket to read; with auto.netns naming the pod's
// namespace the adaptive max reads the collector's, and meets the same
// bounds. A reload naming a namespace where the signal cannot be read is
// refused, and the controller goes on reading the pod's; one naming
// another namespace moves the signal there.
func TestGoodputAutoMaxNetNS(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pod := testenv.NewNS(t)
	routeToPod(t, p, pod)
	sel := fmt.Sprintf("{proto: udp, ports: [514], dests: [%s/32]}", podAddr)
	pol := goodputAutoPolicy(t, pod.Path, sel)
	r := startGoodputRig(t, p, pod, netip.AddrPortFrom(podAddr, 514), &pol)

	ports := []tiers.PortRange{{First: 514, Last: 514}}
	var own automax.DropSource
	if err := p.Coll.Do(func() (err error) {
		own, err = automax.OpenDropSource(false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if s, err := own.Read(ports); err != nil || s.Sockets != 0 {
		t.Fatalf("the agent's own namespace: %+v, %v; want no collector socket (the rig is wrong)", s, err)
	}
	// Opened from the test's namespace, neither the agent's nor the pod's.
	src, err := automax.OpenDropSourceIn(pol.Auto.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := src.Read(ports); err != nil || s.Sockets != 1 {
		t.Fatalf("auto.netns %s: %+v, %v; want the collector's socket", pol.Auto.NetNS, s, err)
	}
	am := autoGoodput(t, r, pol, src)

	bad := goodputAutoPolicy(t, "/run/netns/tltest-none", sel)
	err = r.a.Reload(context.Background(), bad)
	if !errors.Is(err, automax.ErrSignalNetNS) {
		t.Errorf("reload with auto.netns %s: %v, want %v", bad.Auto.NetNS, err, automax.ErrSignalNetNS)
	}
	sockets := func(what string, want int) {
		t.Helper()
		n := len(am.History())
		for deadline := time.Now().Add(8 * time.Second); len(am.History()) < n+2 && time.Now().Before(deadline); {
			r.wait(10 * time.Millisecond)
		}
		if h := am.History(); len(h) < n+2 || h[len(h)-1].Sockets != want {
			t.Errorf("%s: %d windows judged, want 2 more, the last with %d collector sockets: %+v", what, len(h)-n, want, h[len(h)-1])
		}
	}
	sockets("after the refused reload", 1)
	// A reload that names another namespace moves the signal there: the
	// agent's own, with no collector socket; then back to the pod's.
	if err := r.a.Reload(context.Background(), goodputAutoPolicy(t, p.Coll.Path, sel)); err != nil {
		t.Fatal(err)
	}
	sockets("auto.netns the agent's namespace", 0)
	if err := r.a.Reload(context.Background(), pol); err != nil {
		t.Fatal(err)
	}
	sockets("auto.netns the pod's again", 1)
}

// TestOpenDropSourceInRefuses: a path that is no network namespace, or
// none at all, is an error naming it, never a source that reads nothing.
func TestOpenDropSourceInRefuses(t *testing.T) {
	testenv.Require(t)
	for _, path := range []string{"/run/netns/tltest-none", "/proc/self/ns/mnt", "/proc/self/status"} {
		src, err := automax.OpenDropSourceIn(path)
		var ne *automax.SignalNetNSError
		if !errors.As(err, &ne) || ne.Path != path || !errors.Is(err, automax.ErrSignalNetNS) || !strings.Contains(err.Error(), path) {
			t.Errorf("OpenDropSourceIn(%s) = %v, want a *SignalNetNSError naming it", path, err)
		}
		if src != nil {
			src.Close()
		}
	}
}
