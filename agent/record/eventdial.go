package record

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
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

// eventICMPWait is how long a UDP report waits, after its write, for an
// ICMP unreachable from its destination (a host with no receiver on the
// port, or none at all): one that comes moves the sender to the name's
// next address.
const eventICMPWait = 200 * time.Millisecond

// eventFallbackDelay is how long a TCP dial waits on the first address
// family before it dials the other in parallel (RFC 8305, Happy Eyeballs;
// net.Dialer's default FallbackDelay).
const eventFallbackDelay = 300 * time.Millisecond

// dial resolves e.addr's host anew and connects to one of its addresses,
// IPv6 and IPv4 in the resolver's order (RFC 6724): over TCP the first
// that answers, the other family dialled in parallel after
// eventFallbackDelay (Happy Eyeballs); over UDP the first that has not
// answered ICMP unreachable (e.refused). The log says which address is
// used when it changes.
func (e *eventSender) dial(ctx context.Context) (net.Conn, error) {
	host, port, err := net.SplitHostPort(e.addr)
	if err != nil {
		return nil, err
	}
	pn, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", port, err)
	}
	addrs, err := e.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%s: no address", host)
	}
	aps := make([]netip.AddrPort, len(addrs))
	for i, a := range addrs {
		aps[i] = netip.AddrPortFrom(a.Unmap(), uint16(pn))
	}
	var c net.Conn
	if e.network == "tcp" {
		c, err = dialHappy(ctx, aps)
	} else {
		c, err = e.dialUDP(ctx, aps)
	}
	if err != nil {
		return nil, err
	}
	if e.network == "tcp" {
		e.noteUsed(c)
	}
	return c, nil
}

// noteUsed logs the address reports go to when it is another than the
// last: a TCP connection made, a UDP report no ICMP refused.
func (e *eventSender) noteUsed(c net.Conn) {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil && ap != e.used {
		e.used = ap
		e.log.Info("events: reports go to "+ap.String(), "syslog", e.network+"://"+e.addr)
	}
}

// dialUDP connects to the first of aps not known to refuse; when all
// have refused, it tries them all again.
func (e *eventSender) dialUDP(ctx context.Context, aps []netip.AddrPort) (net.Conn, error) {
	if e.refused == nil {
		e.refused = map[netip.Addr]bool{}
	}
	if !slices.ContainsFunc(aps, func(ap netip.AddrPort) bool { return !e.refused[ap.Addr()] }) {
		clear(e.refused)
	}
	d := net.Dialer{Timeout: eventTimeout}
	var errs []error
	for _, ap := range aps {
		if e.refused[ap.Addr()] {
			continue
		}
		c, err := d.DialContext(ctx, e.network, ap.String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// dialHappy connects over TCP to the first of aps that answers: the
// addresses of the first one's family in turn, and after
// eventFallbackDelay (or once those have all failed) the other family's
// in parallel (RFC 8305). A connection that loses the race is closed.
func dialHappy(ctx context.Context, aps []netip.AddrPort) (net.Conn, error) {
	var primary, fallback []netip.AddrPort
	for _, ap := range aps {
		if ap.Addr().Is4() == aps[0].Addr().Is4() {
			primary = append(primary, ap)
		} else {
			fallback = append(fallback, ap)
		}
	}
	if len(fallback) == 0 { // one family: dialled in turn, on this goroutine
		var errs []error
		for _, ap := range primary {
			c, err := tcpDialer().DialContext(ctx, "tcp", ap.String())
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		c   net.Conn
		err error
	}
	results := make(chan result, 2)
	serial := func(list []netip.AddrPort) {
		var errs []error
		d := tcpDialer()
		for _, ap := range list {
			c, err := d.DialContext(ctx, "tcp", ap.String())
			if err == nil {
				results <- result{c: c}
				return
			}
			errs = append(errs, err)
		}
		results <- result{err: errors.Join(errs...)}
	}
	go serial(primary)
	racing := 1
	var timer <-chan time.Time
	if len(fallback) > 0 {
		t := time.NewTimer(eventFallbackDelay)
		defer t.Stop()
		timer = t.C
	}
	var errs []error
	startFallback := func() {
		timer, fallback = nil, nil
		racing++
	}
	for {
		select {
		case <-timer:
			go serial(fallback)
			startFallback()
		case r := <-results:
			racing--
			if r.err == nil {
				if racing > 0 { // the other one's connection, if any, is closed
					go func() {
						if l := <-results; l.c != nil {
							l.c.Close()
						}
					}()
				}
				return r.c, nil
			}
			errs = append(errs, r.err)
			if fallback != nil {
				go serial(fallback)
				startFallback()
				continue
			}
			if racing == 0 {
				return nil, errors.Join(errs...)
			}
		}
	}
}

// writeUDP writes msg as one datagram and waits eventICMPWait for an ICMP
// unreachable from the destination: one that comes moves the sender to
// the name's next address (e.refused), which takes the report in turn,
// until every address has refused it.
func (e *eventSender) writeUDP(ctx context.Context, conn *net.Conn, msg []byte) error {
	if *conn != nil && e.stale(ctx, *conn) {
		(*conn).Close()
		*conn = nil
	}
	var errs []error
	for range 16 { // bounds the addresses tried for one report
		if *conn == nil {
			c, err := e.dial(ctx)
			if err != nil {
				return errors.Join(append(errs, err)...)
			}
			*conn, e.dialed = c, time.Now()
		}
		c := *conn
		c.SetWriteDeadline(time.Now().Add(eventTimeout))
		_, err := c.Write(msg)
		if err == nil {
			c.SetReadDeadline(time.Now().Add(eventICMPWait))
			var buf [1]byte
			_, err = c.Read(buf[:])
			if errors.Is(err, os.ErrDeadlineExceeded) {
				e.noteUsed(c)
				return nil // no word of a refusal: taken as sent
			}
		}
		if err == nil || !unreachable(err) {
			return err
		}
		ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
		e.log.Info("events: "+ap.String()+" is unreachable for reports: trying the name's next address", "syslog", e.network+"://"+e.addr, "error", err)
		e.refused[ap.Addr()] = true
		errs = append(errs, err)
		c.Close()
		*conn = nil
		if len(e.refused) >= 16 {
			break
		}
		if e.allRefused(ctx) {
			clear(e.refused)
			return errors.Join(errs...)
		}
	}
	return errors.Join(errs...)
}

// lookup resolves host (e.addr's) within eventTimeout: the one look-up
// that dial, allRefused and stale share.
func (e *eventSender) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	rctx, cancel := context.WithTimeout(ctx, eventTimeout)
	defer cancel()
	return e.resolve(rctx, host)
}

// allRefused reports whether every address the name resolves to now has
// refused.
func (e *eventSender) allRefused(ctx context.Context) bool {
	host, _, err := net.SplitHostPort(e.addr)
	if err != nil {
		return true
	}
	addrs, err := e.lookup(ctx, host)
	if err != nil {
		return true
	}
	for _, a := range addrs {
		if !e.refused[a.Unmap()] {
			return false
		}
	}
	return true
}

// unreachable: an ICMP unreachable or a refusal, for a UDP socket.
func unreachable(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH)
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
	addrs, err := e.lookup(ctx, host)
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
