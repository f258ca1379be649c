package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tierlimit/tierlimit/agent/pin"
)

// Words for a bpffs that is not the agent's (issue 26): a private mount
// namespace (ip netns exec, unshare -m, a container without the host's
// bpffs) has a /sys/fs/bpf of its own, which ends with it.

// privateBPFFSHint names the fixes for *pin.PrivateBPFFSError.
const privateBPFFSHint = "pins must live in a bpffs that outlives the agent: " +
	"run it in the host's mount namespace (nsenter --net=/run/netns/NAME instead of ip netns exec, which mounts a fresh /sys), " +
	"or mount the host's bpffs into its namespace or container (a hostPath /sys/fs/bpf, as deploy/kubernetes does), " +
	"or pass --no-pin to accept that the limiter is detached when the agent stops"

// explainNotPinned adds to ErrNotPinned from status or detach, and to
// ErrInterfaceBusy from detach (a link it cannot see holds the interface),
// where they looked, and why that may not be where the agent pinned. err
// otherwise.
func explainNotPinned(err error, pinPath string) error {
	if !errors.Is(err, pin.ErrNotPinned) && !errors.Is(err, pin.ErrInterfaceBusy) {
		return err
	}
	m := pin.LookupBPFFS(pinPath)
	var b strings.Builder
	if !m.OnBPFFS() {
		fmt.Fprintf(&b, "looked in %s: ", describeBPFFS(m))
	} else {
		fmt.Fprintf(&b, "looked in the %s: ", describeBPFFS(m))
	}
	if pid, held := pin.LockHolder(pinPath); held {
		if pid == "" {
			pid = "PID"
		}
		fmt.Fprintf(&b, "an agent (pid %s) holds this pin path, so its pins are in another mount namespace's bpffs: look there with nsenter --mount --target %s tierlimit ...", pid, pid)
	} else {
		b.WriteString("an agent started in another mount namespace (ip netns exec, unshare -m, a container) may see another bpffs at this path; " +
			"run this command where the agent ran, with nsenter --net=/run/netns/NAME rather than ip netns exec, which mounts a fresh /sys")
	}
	return hinted{err, b.String()}
}

// describeBPFFS says which bpffs a path resolved to, and whether the host's
// init (PID 1) sees the same instance.
func describeBPFFS(m pin.BPFFSMount) string {
	if !m.OnBPFFS() {
		return fmt.Sprintf("%s, where no bpffs is mounted in this mount namespace (it is %s)", m.Dir, m.FSType)
	}
	s := fmt.Sprintf("bpffs mounted at %s (dev %s", m.Mount, m.Dev)
	switch {
	case m.PID1Read && m.InPID1:
		s += ", also mounted in PID 1's mount namespace)"
	case m.PID1Read && m.HostPID1:
		s += ", not mounted in PID 1's mount namespace: private to this one)"
	default:
		s += ")"
	}
	return s
}
