package record

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// eventReresolve is how often a connection to events.syslog checks that
// its host name still resolves to the address it is connected to: after
// a DNS change, reports go to the new address within it.
const eventReresolve = 30 * time.Second

// lookupHost resolves host with the system's resolver (/etc/hosts, DNS);
// an address literal is itself.
func lookupHost(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// dial resolves e.addr's host anew and connects to the first of its
// addresses that answers.
func (e *eventSender) dial(ctx context.Context) (net.Conn, error) {
	host, port, err := net.SplitHostPort(e.addr)
	if err != nil {
		return nil, err
	}
	pn, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", port, err)
	}
	rctx, cancel := context.WithTimeout(ctx, eventTimeout)
	addrs, err := e.resolve(rctx, host)
	cancel()
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s: no address", host)
	}
	d := net.Dialer{Timeout: eventTimeout}
	var errs []error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, e.network, netip.AddrPortFrom(a.Unmap(), uint16(pn)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// stale reports whether conn should be dialled again before the next
// report: its TCP peer closed or reset it (a receiver that restarted: a
// report written now would be counted sent and lost), or, every
// e.reresolve, its host name no longer resolves to its address.
func (e *eventSender) stale(ctx context.Context, conn net.Conn) bool {
	if tc, ok := conn.(*net.TCPConn); ok && peerClosed(tc) {
		return true
	}
	if time.Since(e.dialed) < e.reresolve {
		return false
	}
	host, _, err := net.SplitHostPort(e.addr)
	if err != nil {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, eventTimeout)
	addrs, err := e.resolve(rctx, host)
	cancel()
	if err != nil {
		return false // keep what works while the resolver does not
	}
	e.dialed = time.Now()
	remote, err := netip.ParseAddrPort(conn.RemoteAddr().String())
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if a.Unmap() == remote.Addr().Unmap() {
			return false
		}
	}
	e.log.Info("events: the syslog host resolves to another address: connecting to it", "syslog", e.network+"://"+e.addr,
		"was", remote.Addr(), "now", addrs)
	return true
}

// peerClosed peeks at c without waiting: the peer sent its FIN (a read
// of 0 bytes) or reset the connection. Data the receiver sent (a syslog
// receiver sends none) is left unread.
func peerClosed(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || (err != nil && !errors.Is(err, syscall.EAGAIN))
		return true
	})
	return err == nil && closed
}

// frame frames msg for TCP: octet-counted (RFC 6587 §3.4.1), or ended by
// a line feed (§3.4.2), with any line feed inside made a space so that
// the message stays one frame.
func frame(framing string, msg []byte) []byte {
	if framing != tiers.FramingLF {
		return append([]byte(strconv.Itoa(len(msg))+" "), msg...)
	}
	out := make([]byte, 0, len(msg)+1)
	for _, b := range msg {
		if b == '\n' {
			b = ' '
		}
		out = append(out, b)
	}
	return append(out, '\n')
}

// sendHint says what an error sending a report may mean: EPERM on a
// connect or send is a filter of the agent's own (a systemd unit's
// IPAddressDeny=, a cgroup or seccomp filter), not the destination.
func sendHint(err error) string {
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return "refused on this host, not by the destination: an IP address filter on the agent (systemd IPAddressDeny=: allow the SIEM with IPAddressAllow=), or a firewall rule"
	}
	return ""
}
