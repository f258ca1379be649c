// Package traffic generates and counts syslog-over-UDP traffic for the
// sandbox demo and the tests: RFC 5424 messages tagged with their burst
// and sequence number, sent paced over a time span, and a receiver that
// counts what arrives. It needs no privilege; the callers put the sockets
// in network namespaces (internal/sandbox).
package traffic

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"
)

// SyslogMessage is an RFC 5424 message tagged "burst=<burst> seq=<seq>", so
// that a receiver can tell which burst (window) each datagram belongs to.
func SyslogMessage(burst, seq int) []byte {
	return fmt.Appendf(nil, "<134>1 2026-11-29T17:00:00.000Z sender tltest 4242 ID47 - burst=%d seq=%d", burst, seq)
}

// BurstOf returns the burst number of a SyslogMessage, false for anything
// else.
func BurstOf(msg []byte) (int, bool) {
	i := bytes.Index(msg, []byte("burst="))
	if i < 0 {
		return 0, false
	}
	rest := msg[i+len("burst="):]
	end := bytes.IndexByte(rest, ' ')
	if end < 0 {
		end = len(rest)
	}
	b, err := strconv.Atoi(string(rest[:end]))
	return b, err == nil
}

// Pace sends count datagrams msg(0..count-1) from conn to dst, spread
// evenly over spread, catching up after a late wakeup, and stops early once
// budget has passed since it started or ctx ends (returning ctx's error).
// It returns how many it sent. A datagram the kernel refused (ENOBUFS, say)
// is an error: the caller's counts would be wrong.
func Pace(ctx context.Context, conn *net.UDPConn, dst netip.AddrPort, count int, spread, budget time.Duration, msg func(i int) []byte) (int, error) {
	start := time.Now()
	var interval time.Duration
	if count > 0 {
		interval = spread / time.Duration(count)
	}
	sent := 0
	for sent < count {
		if err := ctx.Err(); err != nil {
			return sent, err
		}
		elapsed := time.Since(start)
		if elapsed > budget {
			return sent, nil
		}
		due := count
		if interval > 0 {
			due = min(count, int(elapsed/interval)+1)
		}
		for ; sent < due; sent++ {
			if _, err := conn.WriteToUDPAddrPort(msg(sent), dst); err != nil {
				return sent, fmt.Errorf("datagram %d: %w", sent, err)
			}
		}
		if sent < count {
			time.Sleep(time.Duration(sent)*interval - time.Since(start))
		}
	}
	return sent, nil
}

// Counter counts the datagrams a UDP socket receives, until it is closed.
type Counter struct {
	conn *net.UDPConn
	n    atomic.Int64
	done chan struct{}
}

// NewCounter counts what conn receives from now on; it owns conn.
func NewCounter(conn *net.UDPConn) *Counter {
	c := &Counter{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		buf := make([]byte, 2048)
		for {
			if _, _, err := conn.ReadFromUDP(buf); err != nil {
				return
			}
			c.n.Add(1)
		}
	}()
	return c
}

// Count is the number of datagrams received so far.
func (c *Counter) Count() int64 { return c.n.Load() }

// Close closes the socket and waits for the counting to stop.
func (c *Counter) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}
