package attach

import (
	"errors"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestStackedKinds runs the stacking rule on links as netlink reports
// them, for kinds the test machines may lack modules for (vlan, bond,
// vxlan): a vlan on a bond over eth0 is stacked on eth0; a veth's peer and
// a tunnel's underlay are not.
func TestStackedKinds(t *testing.T) {
	attrs := func(name string, idx, parent, master int) netlink.LinkAttrs {
		return netlink.LinkAttrs{Name: name, Index: idx, ParentIndex: parent, MasterIndex: master}
	}
	eth0 := &netlink.Device{LinkAttrs: attrs("eth0", 2, 0, 3)}
	bond0 := &netlink.Bond{LinkAttrs: attrs("bond0", 3, 0, 0)}
	vlan := &netlink.Vlan{LinkAttrs: attrs("bond0.100", 4, 3, 0), VlanId: 100}
	v1 := &netlink.Veth{LinkAttrs: attrs("v1", 5, 6, 0)}
	v2 := &netlink.Veth{LinkAttrs: attrs("v2", 6, 5, 0)}
	vx := &netlink.Vxlan{LinkAttrs: attrs("vx0", 7, 2, 0), VtepDevIndex: 2}
	ipvl := &netlink.IPVlan{LinkAttrs: attrs("ipvl0", 8, 5, 0)}
	all := []netlink.Link{eth0, bond0, vlan, v1, v2, vx, ipvl}
	for _, c := range []struct {
		ifaces []netlink.Link
		want   string // "" for no error
	}{
		{[]netlink.Link{eth0, vlan}, "bond0.100 is a vlan on bond0, bond0 is the bond master of eth0"},
		{[]netlink.Link{bond0, eth0}, "bond0 is the bond master of eth0"},
		{[]netlink.Link{ipvl, v1}, "ipvl0 is an ipvlan on v1"},
		{[]netlink.Link{v1, v2}, ""},
		{[]netlink.Link{eth0, vx}, ""},
		{[]netlink.Link{vlan, v1}, ""},
	} {
		err := stacked(all, c.ifaces)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v, want no error", names(c.ifaces), err)
		case c.want != "" && (!errors.Is(err, ErrStacked) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want ErrStacked saying %q", names(c.ifaces), err, c.want)
		}
	}
}

func names(ls []netlink.Link) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Attrs().Name
	}
	return out
}
