package agent

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestOtherUnicast reads a device's address list as the fdb dump gives it
// (the dump of a veth with a macvlan child: its multicast groups, and the
// child's MAC): only a unicast MAC other than the device's own, on that
// device, keeps the MAC check off.
func TestOtherUnicast(t *testing.T) {
	own := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	child := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x70}
	mc := []netlink.Neigh{
		{LinkIndex: 3, HardwareAddr: net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}},
		{LinkIndex: 3, HardwareAddr: net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}},
		{LinkIndex: 3, HardwareAddr: own},
		{LinkIndex: 4, HardwareAddr: child},
	}
	if why := otherUnicast(mc, 3, own); why != "" {
		t.Errorf("multicast groups, its own MAC and another device's entry: %q, want none", why)
	}
	if why := otherUnicast(append(mc, netlink.Neigh{LinkIndex: 3, HardwareAddr: child}), 3, own); why == "" {
		t.Errorf("a child's MAC in the list: none found")
	}
}
