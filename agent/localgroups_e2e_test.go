package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
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

// TestDestsLocalDocMulticast (issue 43): what docs/policy.md says of
// dests: local and multicast, read against the agent on this kernel. The
// doc says the joined groups are followed and 224.0.0.0/4 is held whole
// only before Linux 6.13; the agent holds IPv4 all-hosts (224.0.0.1, a
// group every interface joins) and, from 6.13, not 224.0.0.0/4 whole.
func TestDestsLocalDocMulticast(t *testing.T) {
	doc, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(doc)
	i := strings.Index(sec, "### dests")
	if i < 0 {
		t.Fatal("docs/policy.md has no ### dests section")
	}
	sec = sec[i:]
	if j := strings.Index(sec[len("### dests"):], "\n#"); j >= 0 {
		sec = sec[:len("### dests")+j]
	}
	flat := strings.Join(strings.Fields(sec), " ")
	if !strings.Contains(flat, "multicast groups joined") {
		t.Errorf("docs/policy.md's dests section does not say that local follows the joined multicast groups")
	}
	for k := 0; ; {
		n := strings.Index(flat[k:], "224.0.0.0/4")
		if n < 0 {
			break
		}
		k += n
		if ctx := flat[max(0, k-80):k]; !strings.Contains(ctx, "before") || !strings.Contains(ctx, "6.13") {
			t.Errorf("docs/policy.md says 224.0.0.0/4 without \"before Linux 6.13\": %q", flat[max(0, k-80):min(len(flat), k+40)])
		}
		k++
	}
	testenv.Require(t)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor)
	p := newPair(t)
	a := startAgent(t, p, attach.XDPAuto, policy(t, 100000))
	if major > 6 || major == 6 && minor >= 13 {
		waitLocalPrefix(t, a, netip.MustParsePrefix("224.0.0.1/32"), true)
		waitLocalPrefix(t, a, netip.MustParsePrefix("224.0.0.0/4"), false)
	} else {
		waitLocalPrefix(t, a, netip.MustParsePrefix("224.0.0.0/4"), true)
	}
}
