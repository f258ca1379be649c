package attach

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sysutil"
)

// host is the host describer: what the program may check of the frames
// on each attached interface, and which of them run in generic mode
// (gso.go). Its methods run with the Attacher's mu held, or before the
// Attacher is shared.
type host struct {
	*env
	// ifaces is what the program was last told of the attached
	// interfaces.
	ifaces []bpf.Iface
}

// describe tells the program what it may check of the frames on
// each attached interface (bpf.Iface, bpf/host.h): that a unicast frame
// not to the interface's MAC is another host's, and which addresses are
// martians. The MAC check is off wherever another device may take such a
// frame from this one (macAcceptors), so that it never passes uncounted a
// frame that Linux delivers. Logs what changed.
func (a *host) describe(attached []*Attachment) error {
	all, err := a.nh.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var ifs []bpf.Iface
	var why []string
	for _, att := range attached {
		i := slices.IndexFunc(all, func(l netlink.Link) bool { return l.Attrs().Index == att.Index })
		if i < 0 {
			continue // deleted: Watch re-attaches, and describes it then
		}
		ifc, off := a.iface(all[i], all)
		ifs = append(ifs, ifc)
		why = append(why, off)
	}
	if slices.EqualFunc(ifs, a.ifaces, sameIface) {
		return nil
	}
	unchecked, err := a.lim.SetIfaces(ifs)
	if err != nil {
		return err
	}
	a.ifaces = ifs
	for i, ifc := range ifs {
		if slices.Contains(unchecked, ifc.Index) {
			a.log.Warn("frames Linux discards are counted on this interface: its ifindex shares the program's slot with another's",
				"ifindex", ifc.Index, "slots", bpf.IfaceSlots)
			continue
		}
		a.log.Info("frames Linux discards pass uncounted", "ifindex", ifc.Index, "mac", ifc.MAC.String(),
			"check_mac", ifc.CheckMAC, "mac_check_off", why[i], "martians", ifc.Martians, "loopback_martian", ifc.LocalnetMartian)
		a.warnForeignChild(ifc)
	}
	return nil
}

func sameIface(x, y bpf.Iface) bool {
	return x.Index == y.Index && bytes.Equal(x.MAC, y.MAC) && x.CheckMAC == y.CheckMAC &&
		x.Martians == y.Martians && x.LocalnetMartian == y.LocalnetMartian
}

// iface is l's bpf.Iface among all the namespace's links, and why its
// MAC check is off ("" when on).
func (a *host) iface(l netlink.Link, all []netlink.Link) (bpf.Iface, string) {
	at := l.Attrs()
	ifc := bpf.Iface{Index: at.Index, MAC: slices.Clone(at.HardwareAddr)}
	why := a.macAcceptors(l, all)
	ifc.CheckMAC = why == "" && len(at.HardwareAddr) == 6
	// ip6_rcv_core spares loopback and L3 master (VRF) devices.
	ifc.Martians = at.Flags&net.FlagLoopback == 0 && l.Type() != "vrf"
	ifc.LocalnetMartian = ifc.Martians && at.MasterIndex == 0 && !a.routeLocalnet(at.Name)
	return ifc, why
}

// macAcceptors says why l may take, as its own, frames to a MAC other
// than l's ("" when it may not): an rx_handler takes them (a bridge, bond,
// team or openvswitch port has a master; macvlan, macvtap, ipvlan, macsec
// and VLAN devices on l are its children here, and add their MACs to l's
// unicast list, dev_uc_add, wherever they live), l is promiscuous (a
// macvlan in passthru mode, an hsr port, a capture), l is a master (a
// bridge passes up frames to its ports' MACs), or l sits on another
// device (a VLAN device takes frames to its lower's MAC, vlan_do_receive).
func (a *host) macAcceptors(l netlink.Link, all []netlink.Link) string {
	if why := linkAcceptors(l, all); why != "" {
		return why
	}
	at := l.Attrs()
	fdb, err := a.nh.NeighList(at.Index, unix.AF_BRIDGE)
	if err != nil {
		return "its unicast address list cannot be read: " + err.Error()
	}
	return otherUnicast(fdb, at.Index, at.HardwareAddr)
}

// linkAcceptors is macAcceptors from the links alone: all but the
// unicast list.
func linkAcceptors(l netlink.Link, all []netlink.Link) string {
	at := l.Attrs()
	if at.MasterIndex != 0 {
		return fmt.Sprintf("it has a master (ifindex %d)", at.MasterIndex)
	}
	if at.Promisc > 0 {
		return "it is promiscuous"
	}
	if at.ParentIndex != 0 && at.ParentIndex != at.Index && l.Type() != "veth" {
		return fmt.Sprintf("it is a %s on ifindex %d", l.Type(), at.ParentIndex)
	}
	if masterKinds[l.Type()] || l.Type() == "openvswitch" {
		return "it is a " + l.Type()
	}
	for _, o := range all {
		oa := o.Attrs()
		if oa.ParentIndex == at.Index && oa.Index != at.Index && o.Type() != "veth" {
			return fmt.Sprintf("%s (%s) sits on it", oa.Name, o.Type())
		}
		if oa.MasterIndex == at.Index {
			return fmt.Sprintf("it is the master of %s", oa.Name)
		}
	}
	return ""
}

// otherUnicast says which unicast MAC besides own the address list fdb
// (`bridge fdb show dev`, ndo_dflt_fdb_dump: the device's unicast and
// multicast lists) holds for device idx, "" when none: a MAC a child
// device added (dev_uc_add) to receive through idx.
func otherUnicast(fdb []netlink.Neigh, idx int, own net.HardwareAddr) string {
	for _, n := range fdb {
		m := n.HardwareAddr
		if n.LinkIndex == idx && len(m) == 6 && m[0]&1 == 0 && !bytes.Equal(m, own) {
			return "it accepts " + m.String() + " for another device"
		}
	}
	return ""
}

// routeLocalnet reports whether net.ipv4.conf.{all,name}.route_localnet
// is set in the agent's namespace, or cannot be read: then 127.0.0.0/8 is
// routed (ip_route_input_slow), not a martian.
func (a *host) routeLocalnet(name string) bool {
	on := true
	_ = inNS(a.ns, func() error {
		on = false
		for _, dev := range []string{"all", name} {
			b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + dev + "/route_localnet")
			if err != nil || strings.TrimSpace(string(b)) != "0" {
				on = true
			}
		}
		return nil
	})
	return on
}

// FollowIfaces describes the interfaces again whenever a link of the
// agent's namespace changes (a MAC, a master, promiscuity, a child
// device), until done is closed; events in a burst are read as one, after
// a quiet 50 ms. What sends no event (a child in another namespace coming
// up, a sysctl) is read again on each Watch round.
//
// ns is the agent's namespace (NS), a handle of FollowIfaces' own, which
// it closes.
func (a *Attacher) FollowIfaces(done <-chan struct{}, ns netns.NsHandle) {
	defer ns.Close()
	links := make(chan netlink.LinkUpdate, 64)
	errf := subscriptionErrors(a.log, done, "following links")
	// Opened on a thread of the agent's namespace: with Namespace set the
	// netlink package enters it (setns), which needs CAP_SYS_ADMIN.
	if err := sysutil.OnThreadIn(ns, "the agent's network namespace", func() error {
		return netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ErrorCallback: errf})
	}); err != nil {
		a.log.Error("cannot follow links: the MAC checks follow them at each watch round only", "err", err)
		return
	}
	ev := sysutil.NewEvents()
	sysutil.Follow(ev, done, links)
	ev.Settle(done, 50*time.Millisecond, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.closed() {
			return
		}
		if err := a.host.describe(a.attached); err != nil {
			a.log.Error("describe interfaces to the program", "err", err)
		}
	})
}

// Ifaces returns what the program was last told of the attached
// interfaces.
func (a *Attacher) Ifaces() []bpf.Iface {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.host.ifaces)
}
