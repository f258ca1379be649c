package localaddr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Groups reads the multicast groups joined on the interfaces of one
// network namespace, the one it was opened in, through rtnetlink
// (RTM_GETMULTICAST dumps: inet6_dump_ifmcaddr, and for IPv4, from Linux
// 6.13, inet_dump_ifmcaddr). Linux delivers a multicast datagram only to
// a group joined on the interface it arrives on (ip6_mc_input:
// ipv6_chk_mcast_addr; ip_route_input_rcu: ip_check_mc_rcu), the groups
// the kernel joins itself among them (all-nodes ff02::1, each address's
// solicited-node group, all-hosts 224.0.0.1). Safe for concurrent use.
type Groups struct {
	mu  sync.Mutex
	fd  int
	seq uint32
	buf []byte
}

// OpenGroups opens a Groups on the calling thread's network namespace: a
// netlink socket stays in the namespace it was made in, wherever it is
// read from later.
func OpenGroups() (*Groups, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(int64(5 * time.Second)) // a dump never blocks a reader for good
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &Groups{fd: fd, buf: make([]byte, 1<<17)}, nil
}

// Close closes g's socket.
func (g *Groups) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fd < 0 {
		return nil
	}
	err := unix.Close(g.fd)
	g.fd = -1
	return err
}

// errNoDump: the kernel has no RTM_GETMULTICAST dump for the family
// (IPv4 before Linux 6.13).
var errNoDump = errors.New("no multicast dump for the family")

// Read returns the groups of family (unix.AF_INET or unix.AF_INET6)
// joined on some interface, each once; errNoDump when the kernel cannot
// list them.
func (g *Groups) Read(family uint8) ([]netip.Addr, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fd < 0 {
		return nil, errors.New("multicast groups: closed")
	}
	g.seq++
	req := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfAddrmsg)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.RTM_GETMULTICAST)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], g.seq)
	req[unix.NLMSG_HDRLEN] = family // ifaddrmsg.ifa_family
	if err := unix.Sendto(g.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("multicast groups: %w", err)
	}
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	for {
		n, _, err := unix.Recvfrom(g.fd, g.buf, 0)
		if err != nil {
			return nil, fmt.Errorf("multicast groups: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(g.buf[:n])
		if err != nil {
			return nil, fmt.Errorf("multicast groups: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != g.seq { // the rest of a dump given up on
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("multicast groups: short netlink error")
				}
				errno := unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data)))
				if errno == unix.EOPNOTSUPP || errno == unix.EINVAL || errno == unix.EAFNOSUPPORT {
					return nil, fmt.Errorf("%w: %v", errNoDump, errno)
				}
				return nil, fmt.Errorf("multicast groups: %w", errno)
			case unix.RTM_NEWMULTICAST, unix.RTM_GETMULTICAST: // a dump's are GET (inet6_fill_ifmcaddr)
				if a, ok := groupOf(m.Data); ok && !seen[a] {
					seen[a] = true
					out = append(out, a)
				}
			}
		}
	}
}

// groupOf reads the IFA_MULTICAST attribute of an RTM_NEWMULTICAST
// message's body (struct ifaddrmsg, then attributes).
func groupOf(b []byte) (netip.Addr, bool) {
	if len(b) < unix.SizeofIfAddrmsg {
		return netip.Addr{}, false
	}
	for at := unix.SizeofIfAddrmsg; at+unix.SizeofRtAttr <= len(b); {
		l := int(binary.NativeEndian.Uint16(b[at:]))
		typ := binary.NativeEndian.Uint16(b[at+2:])
		if l < unix.SizeofRtAttr || at+l > len(b) {
			return netip.Addr{}, false
		}
		if typ == unix.IFA_MULTICAST {
			a, ok := netip.AddrFromSlice(b[at+unix.SizeofRtAttr : at+l])
			return a.Unmap(), ok
		}
		at += (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
	}
	return netip.Addr{}, false
}
