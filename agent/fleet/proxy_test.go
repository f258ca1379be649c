package fleet_test

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// delayProxy is a TCP proxy in front of a store that makes it rtt away:
// each direction's bytes wait rtt/2 before they go on, in order, and a
// connection's first bytes to the store wait one rtt more, the round trip
// of the TCP handshake that the local kernel completes at once. It counts
// the connections it accepted. No netem: the delay is the proxy's own.
type delayProxy struct {
	ln       net.Listener
	target   string
	rtt      time.Duration
	accepted atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
}

// startProxy proxies to target with the round trip rtt; Cleanup closes it.
func startProxy(t *testing.T, target string, rtt time.Duration) *delayProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &delayProxy{ln: ln, target: target, rtt: rtt}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go p.serve()
	return p
}

// addr is the proxy's host:port.
func (p *delayProxy) addr() string { return p.ln.Addr().String() }

func (p *delayProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go p.pipe(up, c, p.rtt/2+p.rtt)
		go p.pipe(c, up, p.rtt/2)
	}
}

// pipe copies src to dst, each chunk delayed by delay from when it was
// read (the first by first), and closes both at the end.
func (p *delayProxy) pipe(dst, src net.Conn, first time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		delay := first
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				ch <- chunk{b[:n], time.Now().Add(delay)}
				delay = p.rtt / 2
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	for range ch {
	}
}

// cut closes every connection through the proxy (a network blip, a load
// balancer's restart): the members must reconnect through it.
func (p *delayProxy) cut() {
	p.mu.Lock()
	cs := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// hangUp listens on addr (a store that went away) and closes every
// connection it accepts after its first bytes, counting those that a
// member opened (its HELLO names the client tierlimit-fleet; a Sentinel's
// own reconnections to the master do not): what a member meets when a
// master's address still takes connections but no server answers (a
// proxy or a Service in front of a dead master).
func hangUp(t *testing.T, addr string) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	var ln net.Listener
	var err error
	for range 50 { // the dead server's socket may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listen on the dead master's %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(time.Second))
				b := make([]byte, 4096)
				k, _ := c.Read(b)
				if bytes.Contains(b[:k], []byte("tierlimit-fleet")) {
					n.Add(1)
				}
			}()
		}
	}()
	return &n
}
