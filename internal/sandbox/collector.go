package sandbox

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// SlowCollector is a UDP syslog collector that can only handle so many
// datagrams per second: a reader that sleeps to hold its rate, behind a
// receive buffer of a size the caller chooses. What it cannot take in time
// overflows the buffer, and the kernel drops it at the socket
// (RcvbufErrors), as it does for a real collector under a flood.
type SlowCollector struct {
	conn *net.UDPConn
	rate atomic.Int64 // datagrams per second
	read atomic.Uint64
	done chan struct{}
}

// NewSlowCollector listens on addr in ns with a receive buffer of rcvbuf
// bytes (SO_RCVBUFFORCE, so the kernel's limits do not apply; the kernel
// doubles it for its bookkeeping) and reads at most rate datagrams per
// second until Close.
func NewSlowCollector(ns *NS, addr netip.AddrPort, rcvbuf, rate int) (*SlowCollector, error) {
	conn, _, err := ListenUDP(ns, addr, rcvbuf)
	if err != nil {
		return nil, err
	}
	c := &SlowCollector{conn: conn, done: make(chan struct{})}
	c.rate.Store(int64(rate))
	go c.loop()
	return c, nil
}

// ListenUDP opens a collector's UDP socket on addr in ns. A rcvbuf over 0
// sets its receive buffer to rcvbuf bytes (SO_RCVBUFFORCE, so the kernel's
// limits do not apply; the kernel doubles it for its bookkeeping); 0 keeps
// the kernel's default. It returns the socket and its SO_RCVBUF as the
// kernel reports it, in bytes.
func ListenUDP(ns *NS, addr netip.AddrPort, rcvbuf int) (*net.UDPConn, int, error) {
	var conn *net.UDPConn
	var got int
	err := ns.Do(func() (err error) {
		if conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr)); err != nil {
			return err
		}
		rc, err := conn.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			if rcvbuf > 0 {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf); serr != nil {
					return
				}
			}
			got, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		}); err != nil {
			return err
		}
		return serr
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, 0, fmt.Errorf("collector on %s in %s: %w", addr, ns.Name, err)
	}
	return conn, got, nil
}

// SetRate changes the datagrams per second the collector reads.
func (c *SlowCollector) SetRate(rate int) { c.rate.Store(int64(rate)) }

// Read is the number of datagrams the collector has read.
func (c *SlowCollector) Read() uint64 { return c.read.Load() }

// Close stops the collector and closes its socket.
func (c *SlowCollector) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

// loop reads one datagram per token of a bucket filled at rate per second
// that holds at most 100 ms worth: a reader that the scheduler held back
// for a moment catches up, one that was idle for long earns no burst.
func (c *SlowCollector) loop() {
	defer close(c.done)
	buf := make([]byte, 64<<10)
	tokens, last := 0.0, time.Now()
	for {
		now := time.Now()
		rate := float64(c.rate.Load())
		tokens = min(tokens+rate*now.Sub(last).Seconds(), max(1, rate/10))
		last = now
		if tokens < 1 {
			time.Sleep(time.Duration((1 - tokens) / rate * float64(time.Second)))
			continue
		}
		if _, _, err := c.conn.ReadFromUDPAddrPort(buf); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		tokens--
		c.read.Add(1)
	}
}
