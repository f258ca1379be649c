package record

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A TCP report counts as sent only once the receiver's kernel has
// acknowledged its last byte (docs/design.md §10): a write lands in the
// send buffer whether or not the peer is alive, so a receiver that
// vanished without a FIN or a reset (its host down, a partition) would
// otherwise take reports counted sent and lost. The connection carries
// TCP_USER_TIMEOUT and keepalive, so that the kernel gives up on a dead
// peer within eventUserTimeout of an unacknowledged report, or within
// eventKeepIdle + eventKeepCount × eventKeepInterval of silence; its
// unacknowledged reports are then written once more on a new connection,
// and those the new one does not take are counted as errors.
const (
	// eventUserTimeout is TCP_USER_TIMEOUT: how long written data may stay
	// unacknowledged before the kernel drops the connection.
	eventUserTimeout = 5 * time.Second
	// Keepalive probes of an idle connection: a dead peer is found within
	// 5 s + 3 × 1 s = 8 s of the last report.
	eventKeepIdle     = 5 * time.Second
	eventKeepInterval = time.Second
	eventKeepCount    = 3
	// eventAckPoll is how often the sender reads how far its reports are
	// acknowledged while some are not.
	eventAckPoll = 20 * time.Millisecond
)

// tcpEstablished is TCP_ESTABLISHED, tcpi_state of an open connection
// (include/net/tcp_states.h).
const tcpEstablished = 1

// pendingReport is a report written to the TCP connection and not yet
// acknowledged: end is the byte count of the connection after it.
type pendingReport struct {
	msg    []byte
	end    uint64
	resent bool // written once already, on a connection that died
}

// tcpDialer is the dialer of a report connection: keepalive and
// TCP_USER_TIMEOUT set before it connects.
func tcpDialer() *net.Dialer {
	return &net.Dialer{
		Timeout: eventTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: eventKeepIdle,
			Interval: eventKeepInterval, Count: eventKeepCount},
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(eventUserTimeout/time.Millisecond))
			})
			return errors.Join(err, serr)
		},
	}
}

// tcpAcked reads how many of the written bytes of c the peer has
// acknowledged (written less SIOCOUTQ, what the send queue still holds)
// and whether the connection is still established.
func tcpAcked(c net.Conn, written uint64) (acked uint64, alive bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return written, true
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, false
	}
	outq, state := -1, uint8(0)
	if err := rc.Control(func(fd uintptr) {
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ); err == nil {
			outq = n
		}
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = info.State
		}
	}); err != nil || outq < 0 {
		return 0, false
	}
	if uint64(outq) > written {
		outq = int(written)
	}
	return written - uint64(outq), state == tcpEstablished
}

// writeTCP writes p on *conn, dialling one when there is none, and keeps
// it pending until acknowledged.
func (e *eventSender) writeTCP(ctx context.Context, conn *net.Conn, p pendingReport) error {
	if *conn != nil && e.stale(ctx, *conn) {
		e.reconnect(ctx, conn)
	}
	if *conn == nil {
		c, err := e.dial(ctx)
		if err != nil {
			return err
		}
		*conn, e.dialed, e.written = c, time.Now(), 0
	}
	b := frame(e.framing, p.msg)
	(*conn).SetWriteDeadline(time.Now().Add(eventTimeout))
	if _, err := (*conn).Write(b); err != nil {
		return err
	}
	e.written += uint64(len(b))
	p.end = e.written
	e.pending = append(e.pending, p)
	return nil
}

// settle counts the pending reports the peer has acknowledged as sent;
// on a connection no longer established (the peer's FIN or reset, or the
// kernel's timeout of a dead peer) it writes the rest once more on a new
// one (reconnect).
func (e *eventSender) settle(ctx context.Context, conn *net.Conn) {
	if *conn == nil || len(e.pending) == 0 {
		return
	}
	acked, alive := tcpAcked(*conn, e.written)
	n := 0
	for n < len(e.pending) && e.pending[n].end <= acked {
		n++
	}
	if n > 0 {
		e.pending = e.pending[n:]
		e.sent.Add(uint64(n))
		e.ok()
	}
	if !alive && len(e.pending) > 0 {
		e.reconnect(ctx, conn)
	}
}

// reconnect closes *conn and writes its unacknowledged reports once more
// on a new connection: one written twice already, or that the new
// connection does not take, is counted as an error.
func (e *eventSender) reconnect(ctx context.Context, conn *net.Conn) {
	if *conn != nil {
		(*conn).Close()
		*conn = nil
	}
	old := e.pending
	e.pending = nil
	var err error
	for _, p := range old {
		if p.resent || err != nil {
			e.errs.Add(1)
			continue
		}
		p.resent = true
		if err = e.writeTCP(ctx, conn, p); err != nil {
			e.errs.Add(1)
			e.fail(err)
		}
	}
	if err != nil {
		e.drop(conn)
	}
}

// drop closes *conn and counts its pending reports as errors.
func (e *eventSender) drop(conn *net.Conn) {
	if *conn != nil {
		(*conn).Close()
		*conn = nil
	}
	e.errs.Add(uint64(len(e.pending)))
	e.pending = nil
}
