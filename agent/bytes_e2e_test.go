package agent_test

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// bytesPassAll is a policy under count: bytes that passes everything: its
// one tier, at 1000 % of 1 TB, is never reached.
const bytesPassAll = "count: bytes\nmax: 1TB\nwindow: 1h\nshape: ordinal\ntiers: [{at: 1000%, drop: 100%}]\nselect: [{proto: udp, ports: [514]}]\n"

// TestBytesKernelOracle: the kernel is the oracle of count: bytes
// (docs/design.md §2). Datagrams of random sizes, 100 B to 8 KB (IPv4 ones
// past the veth's MTU leave as fragments: the first carries the verdict and
// the whole datagram's weight), to a receiver socket in the namespace,
// over IPv4 and IPv6, in native mode; then in generic mode the same, and
// UDP_SEGMENT super-packets of random sizes (the kernel splits them into
// gso_size pieces and a shorter last one). In each run the bytes the
// program counted (the window and passed_bytes_total) are the bytes the
// receiver's recvmsg returned, exactly.
func TestBytesKernelOracle(t *testing.T) {
	pol, err := tiers.ParseYAML([]byte(bytesPassAll))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []attach.XDPMode{attach.XDPNative, attach.XDPGeneric} {
		t.Run(string(mode), func(t *testing.T) {
			testenv.Require(t)
			p := newPair(t)
			a := startAgent(t, p, mode, pol)
			bytesMetricsLint(t, a)
			rng := rand.New(rand.NewPCG(41, uint64(len(mode))))
			for _, dst := range []netip.AddrPort{netip.AddrPortFrom(p.CollAddr, 514), netip.AddrPortFrom(p.CollAddr6, 514)} {
				rx := testenv.NewReceiver(t, p.Coll, dst)
				ping(t, p.Send, dst.Addr().String(), 1, "0.2")
				before := gather(t, a)
				var sent, supers int
				err := p.Send.Do(func() error {
					c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
					if err != nil {
						return err
					}
					defer c.Close()
					for range 300 {
						n := 100 + rng.IntN(8000-100+1)
						if _, err := c.Write(make([]byte, n)); err != nil {
							return err
						}
						sent += n
					}
					if mode != attach.XDPGeneric {
						return nil
					}
					for range 40 {
						seg := 200 + rng.IntN(1200)
						size := seg + rng.IntN(8*seg)
						if _, err := writeSegmented(dst, seg, 1, make([]byte, size)); err != nil {
							return err
						}
						sent += size
						supers++
					}
					return nil
				})
				if err != nil {
					t.Fatalf("send to %v: %v", dst, err)
				}
				if !rx.WaitQuiet(500*time.Millisecond, 20*time.Second) {
					t.Fatalf("the receiver on %v never went quiet", dst)
				}
				after := gather(t, a)
				datagrams, got := rx.Bytes()
				passed := after["tierlimit_passed_bytes_total"] - before["tierlimit_passed_bytes_total"]
				window := after["tierlimit_window_bytes"] - before["tierlimit_window_bytes"]
				t.Logf("%v: sent %d bytes (%d super-packets); the receiver got %d datagrams, %d bytes; the program counted %.0f in the window, passed %.0f",
					dst, sent, supers, datagrams, got, window, passed)
				if got != sent {
					t.Fatalf("the receiver got %d bytes of the %d sent: the path lost some, the test proves nothing", got, sent)
				}
				if passed != float64(got) || window != float64(got) {
					t.Errorf("program counted %.0f bytes in the window and %.0f passed; recvmsg returned %d", window, passed, got)
				}
			}
		})
	}
}

// bytesMetricsLint: under count: bytes the agent exports the _bytes twins
// of the window's and the policy's gauges, not the _packets ones
// (docs/design.md §5), and its metrics pass promlint.
func bytesMetricsLint(t *testing.T, a *agent.Agent) {
	t.Helper()
	problems, err := testutil.CollectAndLint(a.Collector())
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", err, problems)
	}
	m := gather(t, a)
	for _, name := range []string{"tierlimit_window_bytes", "tierlimit_last_window_bytes", "tierlimit_policy_max_bytes",
		"tierlimit_passed_bytes_total", "tierlimit_dropped_bytes_total", "tierlimit_policy_source_budget_bytes"} {
		if _, ok := m[name]; !ok {
			t.Errorf("no %s under count: bytes", name)
		}
	}
	if _, ok := m[`tierlimit_policy_tier_threshold_bytes{tier="1"}`]; !ok {
		t.Errorf("no tierlimit_policy_tier_threshold_bytes{tier=\"1\"} under count: bytes")
	}
	for _, name := range []string{"tierlimit_window_packets", "tierlimit_last_window_packets", "tierlimit_policy_max_packets",
		"tierlimit_policy_source_budget_packets", `tierlimit_policy_tier_threshold_packets{tier="1"}`} {
		if _, ok := m[name]; ok {
			t.Errorf("%s exported under count: bytes", name)
		}
	}
	if m["tierlimit_policy_max_bytes"] != 1e12 {
		t.Errorf("policy_max_bytes %v, want 1e12", m["tierlimit_policy_max_bytes"])
	}
}
