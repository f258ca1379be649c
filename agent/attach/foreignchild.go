package attach

import (
	"bytes"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
)

// warnForeignChild warns when ifc receives for a device that is not in
// the agent's network namespace: a unicast MAC in its address list
// (dev_uc_add) that no device here holds is a macvlan or macvtap child
// moved into another namespace, as a collector's container on the host's
// NIC is (to keep the senders' source addresses). Its addresses are that
// namespace's, which the agent cannot read without entering it
// (CAP_SYS_ADMIN), so dests: local does not count datagrams to them: the
// collector is unprotected unless dests lists its addresses. An ipvlan
// child shares the NIC's MAC and leaves no such trace: the README says so.
func (a *host) warnForeignChild(ifc bpf.Iface) {
	fdb, err := a.nh.NeighList(ifc.Index, unix.AF_BRIDGE)
	if err != nil {
		return
	}
	links, err := a.nh.LinkList()
	if err != nil {
		return
	}
	for _, n := range fdb {
		m := n.HardwareAddr
		if n.LinkIndex != ifc.Index || len(m) != 6 || m[0]&1 != 0 || bytes.Equal(m, ifc.MAC) {
			continue
		}
		here := false
		for _, l := range links {
			here = here || bytes.Equal(l.Attrs().HardwareAddr, m)
		}
		if !here {
			a.log.Warn("a device in another network namespace receives through this interface (a macvlan or macvtap child, such as a collector's container): "+
				"dests: local does not count datagrams to its addresses; list them in the rule's dests",
				"ifindex", ifc.Index, "child_mac", m.String())
		}
	}
}
