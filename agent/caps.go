package agent

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// checkCaps returns ErrNotRoot, naming what is missing, unless the process
// has CAP_NET_ADMIN and either CAP_SYS_ADMIN or both CAP_BPF and
// CAP_PERFMON in its effective set: root, or a hardened service with just
// those. The verifier needs CAP_PERFMON (or CAP_SYS_ADMIN) for the
// program's packet-pointer arithmetic (kernel/bpf/verifier.c,
// allow_ptr_leaks).
func checkCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	var missing []string
	if !has(unix.CAP_NET_ADMIN) {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	if !has(unix.CAP_SYS_ADMIN) {
		if !has(unix.CAP_BPF) {
			missing = append(missing, "CAP_BPF")
		}
		if !has(unix.CAP_PERFMON) {
			missing = append(missing, "CAP_PERFMON")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s (CAP_SYS_ADMIN covers CAP_BPF and CAP_PERFMON)", ErrNotRoot, strings.Join(missing, ", "))
	}
	return nil
}
