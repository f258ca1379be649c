package agent_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestDestsLocalFollowsGroups (issue 33 item 3; docs/design.md §2):
// dests: local holds the multicast groups joined in the agent's
// namespace, not ff00::/8 whole: a group a collector's socket joins after
// start is held from the next watch round, and no longer once the socket
// has left it. TestMulticastJoinedOnly (bpf) checks the counting against
// the kernel's delivery.
func TestDestsLocalFollowsGroups(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	a := startAgent(t, p, attach.XDPAuto, policy(t, 100000))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Watch(ctx, 100*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	group := netip.MustParsePrefix("ff05::514/128")
	waitLocalPrefix(t, a, netip.MustParsePrefix("ff02::1/128"), true) // all-nodes, the kernel's own
	waitLocalPrefix(t, a, netip.MustParsePrefix("ff00::/8"), false)
	waitLocalPrefix(t, a, group, false)
	var fd int
	if err := p.Coll.Do(func() error {
		lk, err := netlink.LinkByName(p.CollIf)
		if err != nil {
			return err
		}
		if fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		return unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP,
			&unix.IPv6Mreq{Multiaddr: group.Addr().As16(), Interface: uint32(lk.Attrs().Index)})
	}); err != nil {
		t.Fatal(err)
	}
	waitLocalPrefix(t, a, group, true)
	unix.Close(fd)
	waitLocalPrefix(t, a, group, false)
}
