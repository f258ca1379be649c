package agent_test

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestRefusesL3Devices: on a TUN device and an ipip tunnel the frame
// starts at the IP header, so New refuses them with a *LinkTypeError that
// names the interface and its link type, and attaches nothing, neither to
// them nor to the Ethernet interface given beside them. A TAP device
// carries Ethernet and is attached.
func TestRefusesL3Devices(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	// ipip needs its module, which some kernels lack: then it is left out.
	cases := []struct{ iface, typ string }{{"tltun0", "none"}}
	err := p.Coll.Do(func() error {
		tun := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tltun0"}, Mode: netlink.TUNTAP_MODE_TUN}
		tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tltap0"}, Mode: netlink.TUNTAP_MODE_TAP}
		for _, l := range []netlink.Link{tun, tap} {
			if err := netlink.LinkAdd(l); err != nil {
				return fmt.Errorf("add %s: %w", l.Attrs().Name, err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		ipip := &netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Name: "tlipip0"}, Local: p.CollAddr.AsSlice(), Remote: net.ParseIP("198.51.100.2")}
		switch err := netlink.LinkAdd(ipip); {
		case errors.Is(err, unix.EOPNOTSUPP):
			t.Logf("no ipip tunnel on this kernel (%v): only the TUN device is tried", err)
			return nil
		case err != nil:
			return fmt.Errorf("add ipip: %w", err)
		}
		cases = append(cases, struct{ iface, typ string }{"tlipip0", "ipip"})
		return netlink.LinkSetUp(ipip)
	})
	if err != nil {
		t.Fatalf("make tun, tap and ipip: %v", err)
	}
	for _, c := range cases {
		a, err := newAgent(p, agent.Config{Interfaces: []string{p.CollIf, c.iface}}, policy(t, 1000))
		if err == nil {
			a.Close()
			t.Fatalf("%s: New attached", c.iface)
		}
		var lt *attach.LinkTypeError
		if !errors.As(err, &lt) || !errors.Is(err, attach.ErrNotEthernet) || lt.Iface != c.iface || lt.Type != c.typ {
			t.Errorf("%s: New: %v, want a *LinkTypeError for %s of type %q", c.iface, err, c.iface, c.typ)
		}
		for _, iface := range []string{p.CollIf, c.iface} {
			if x := testenv.XDP(t, p.Coll, iface); x.ID != 0 {
				t.Errorf("%s refused, yet %s runs program %d (%s)", c.iface, iface, x.ID, x.Mode)
			}
		}
	}
	a, err := newAgent(p, agent.Config{Interfaces: []string{"tltap0"}, XDPMode: attach.XDPGeneric}, policy(t, 1000))
	if err != nil {
		t.Fatalf("tap: %v", err)
	}
	defer a.Close()
	if x := testenv.XDP(t, p.Coll, "tltap0"); x.ID == 0 {
		t.Errorf("tap: nothing attached")
	}
}
