package agent

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Capabilities New needs (include/uapi/linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
	capBPF      = 39
)

// checkCaps returns ErrNotRoot, naming what is missing, unless the process
// has CAP_NET_ADMIN and either CAP_BPF or CAP_SYS_ADMIN in its effective
// set: root, or a hardened service with just those capabilities.
func checkCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	var missing []string
	if !has(capNetAdmin) {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	if !has(capBPF) && !has(capSysAdmin) {
		missing = append(missing, "CAP_BPF (or CAP_SYS_ADMIN)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s", ErrNotRoot, strings.Join(missing, ", "))
	}
	return nil
}
