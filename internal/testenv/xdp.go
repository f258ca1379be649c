package testenv

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// Attached is the XDP program the kernel shows on an interface.
type Attached struct {
	// Mode is "native", "generic", or "" when nothing is attached.
	Mode string
	// ID and Name identify the program; 0 and "" when nothing is attached.
	ID   uint32
	Name string
}

// XDP reports the XDP program attached to iface inside ns.
func XDP(tb testing.TB, ns *NS, iface string) Attached {
	tb.Helper()
	var a Attached
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		x := l.Attrs().Xdp
		if x == nil || !x.Attached {
			return nil
		}
		a.ID = x.ProgId
		switch x.AttachMode {
		case nl.XDP_ATTACHED_DRV:
			a.Mode = "native"
		case nl.XDP_ATTACHED_SKB:
			a.Mode = "generic"
		default:
			a.Mode = fmt.Sprint("attach mode ", x.AttachMode)
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("link %s in %s: %v", iface, ns.Name, err)
	}
	if a.ID != 0 {
		prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(a.ID))
		if err != nil {
			tb.Fatalf("program %d on %s: %v", a.ID, iface, err)
		}
		defer prog.Close()
		if info, err := prog.Info(); err == nil {
			a.Name = info.Name
		}
	}
	return a
}

// AttachForeign attaches prog to iface inside ns through netlink in
// generic mode, as `ip link set dev IF xdpgeneric fd ...` does: another
// tool's program, which the agent must not touch unless told to. Deleting
// ns detaches it.
func AttachForeign(tb testing.TB, ns *NS, iface string, prog *ebpf.Program) {
	tb.Helper()
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		return netlink.LinkSetXdpFdWithFlags(l, prog.FD(), nl.XDP_FLAGS_SKB_MODE)
	}); err != nil {
		tb.Fatalf("attach %s to %s in %s: %v", prog, iface, ns.Name, err)
	}
}
