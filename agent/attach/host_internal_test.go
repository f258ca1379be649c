package attach

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

// TestLinkAcceptors checks when the MAC check is off from the links
// alone: for a port, a master, a promiscuous device, a device stacked on
// another or with one stacked on it; and on for a plain device or veth,
// whatever veths elsewhere point at it.
func TestLinkAcceptors(t *testing.T) {
	attrs := func(idx, parent, master, promisc int) netlink.LinkAttrs {
		return netlink.LinkAttrs{Index: idx, Name: "if" + string(rune('0'+idx)), ParentIndex: parent, MasterIndex: master, Promisc: promisc}
	}
	eth := &netlink.Device{LinkAttrs: attrs(2, 0, 0, 0)}
	veth := &netlink.Veth{LinkAttrs: attrs(3, 2, 0, 0)} // a peer whose index elsewhere is 2
	for _, c := range []struct {
		name string
		l    netlink.Link
		all  []netlink.Link
		off  bool
	}{
		{"plain device", eth, []netlink.Link{eth, veth}, false},
		{"veth", veth, []netlink.Link{eth, veth}, false},
		{"bridge port", &netlink.Device{LinkAttrs: attrs(2, 0, 9, 0)}, nil, true},
		{"promiscuous", &netlink.Device{LinkAttrs: attrs(2, 0, 0, 1)}, nil, true},
		{"vlan device", &netlink.Vlan{LinkAttrs: attrs(4, 2, 0, 0)}, nil, true},
		{"bridge", &netlink.Bridge{LinkAttrs: attrs(9, 0, 0, 0)}, nil, true},
		{"master of a port", eth, []netlink.Link{eth, &netlink.Device{LinkAttrs: attrs(5, 0, 2, 0)}}, true},
		{"macvlan on it", eth, []netlink.Link{eth, &netlink.Macvlan{LinkAttrs: attrs(6, 2, 0, 0)}}, true},
		{"vlan on it", eth, []netlink.Link{eth, &netlink.Vlan{LinkAttrs: attrs(7, 2, 0, 0)}}, true},
	} {
		if why := linkAcceptors(c.l, c.all); (why != "") != c.off {
			t.Errorf("%s: %q, want the check off %v", c.name, why, c.off)
		}
	}
}
