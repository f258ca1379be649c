package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// nativeHint says what to change so that the driver of iface accepts
// native XDP, from the errno of the refusal and what sysfsNet (normally
// /sys/class/net) shows of the interface: its driver, MTU and queues. A
// bpf_link attach carries no extack, so the errno is all the kernel says;
// the hint names the likely cause for the driver and the command that
// changes it. Empty when there is nothing specific to say.
func nativeHint(sysfsNet, iface string, err error) string {
	drv, _ := os.Readlink(filepath.Join(sysfsNet, iface, "device", "driver"))
	if filepath.Base(drv) != "virtio_net" {
		return ""
	}
	mtu := readTrim(filepath.Join(sysfsNet, iface, "mtu"))
	switch {
	case errors.Is(err, unix.EINVAL):
		// virtnet_xdp_set: the MTU must fit one page with the headers on
		// kernels before 6.3 (no multi-buffer XDP); the kernel log has the limit.
		return fmt.Sprintf("virtio_net refuses native XDP when a frame does not fit one page (MTU %s here; the kernel log gives the limit): "+
			"lower it, e.g. ip link set dev %s mtu 1500", mtu, iface)
	case errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Sprintf("virtio_net refuses native XDP while the host implements receive offloads the guest cannot switch off: "+
			"give the VM's NIC ctrl_guest_offloads (QEMU's default) or turn the host offloads off "+
			"(libvirt: <driver><guest csum='off' tso4='off' tso6='off' ecn='off' ufo='off'/></driver>); ethtool -k %s shows them", iface)
	case errors.Is(err, unix.ENOMEM):
		// Kernels before 5.17 want a free TX queue per CPU for XDP_TX.
		return fmt.Sprintf("virtio_net wants a free TX queue per CPU for XDP (kernels before 5.17): use fewer queue pairs, "+
			"ethtool -L %s combined N, with N + CPUs <= the device's maximum (ethtool -l %s), or give the VM's NIC more queues (libvirt: <driver queues='2×vCPUs'/>)", iface, iface)
	}
	return ""
}

// readTrim returns the trimmed content of a small file, or "?".
func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}
