package record

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// lineReceiver is a TCP syslog receiver that frames by line feed, as
// Fluent Bit, Logstash and Filebeat do: each line is one message.
type lineReceiver struct {
	ln    net.Listener
	mu    sync.Mutex
	lines []string
	conns []net.Conn
}

func newLineReceiver(t *testing.T, addr string) *lineReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &lineReceiver{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			go func() {
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					r.mu.Lock()
					r.lines = append(r.lines, sc.Text())
					r.mu.Unlock()
				}
			}()
		}
	}()
	t.Cleanup(r.close)
	return r
}

// close stops the receiver as a restart does: its listener and every
// connection are closed (the kernel sends each peer a FIN).
func (r *lineReceiver) close() {
	r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}

func (r *lineReceiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

func (r *lineReceiver) wait(t *testing.T, n int) []string {
	t.Helper()
	waitUntil(t, func() bool { return len(r.got()) >= n })
	return r.got()
}

func startSender(t *testing.T, network, addr, framing string) *eventSender {
	t.Helper()
	e := newEventSender(slog.New(slog.DiscardHandler), network, addr, nil)
	e.framing = framing
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go e.run(ctx)
	return e
}

func report(i int) []byte {
	return formatRFC5424(5, time.Now(), "host", "shed-summary", []sdParam{{"event", "summary"}, {"n", strconv.Itoa(i)}}, "line one\nline two")
}

// TestEventSenderLF (issue 35 B51): with events.framing: lf, each report
// reaches a receiver that frames by line feed as one message, parsed as
// RFC 5424 whole; the default, octet-counted, does not.
func TestEventSenderLF(t *testing.T) {
	r := newLineReceiver(t, "127.0.0.1:0")
	e := startSender(t, "tcp", r.ln.Addr().String(), tiers.FramingLF)
	for i := range 3 {
		e.send(report(i))
	}
	lines := r.wait(t, 3)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %q", len(lines), lines)
	}
	for i, l := range lines {
		m, err := parseRFC5424(l)
		if err != nil || m.params["n"] != strconv.Itoa(i) || m.msg != "line one line two" {
			t.Errorf("line %d %q: %+v %v", i, l, m, err)
		}
	}
	waitUntil(t, func() bool { return e.sent.Load() == 3 }) // counted once acknowledged
	if e.sent.Load() != 3 || e.errs.Load() != 0 {
		t.Errorf("sent %d, errors %d", e.sent.Load(), e.errs.Load())
	}
}

// TestEventSenderReceiverRestart (issue 35 B50): a TCP receiver that
// restarts between reports loses none of them, and none is counted sent
// that it did not get: the sender sees the closed connection before it
// writes, and dials the new receiver.
func TestEventSenderReceiverRestart(t *testing.T) {
	r := newLineReceiver(t, "127.0.0.1:0")
	addr := r.ln.Addr().String()
	e := startSender(t, "tcp", addr, tiers.FramingLF)
	e.send(report(0))
	r.wait(t, 1)
	for restart := 1; restart <= 3; restart++ {
		r.close()
		r = newLineReceiver(t, addr)
		for i := range 2 {
			e.send(report(10*restart + i))
		}
		if got := r.wait(t, 2); len(got) != 2 {
			t.Fatalf("restart %d: the new receiver got %q", restart, got)
		}
	}
	waitUntil(t, func() bool { return e.sent.Load()+e.errs.Load() == 7 })
	if e.sent.Load() != 7 || e.errs.Load() != 0 {
		t.Errorf("sent %d, errors %d, want 7 and 0", e.sent.Load(), e.errs.Load())
	}
}

// TestEventSenderReresolve (issue 35 B54): events.syslog names a host;
// when the name moves to another address, reports follow it within the
// re-resolve period, over TCP and over UDP.
func TestEventSenderReresolve(t *testing.T) {
	for _, network := range []string{"tcp", "udp"} {
		t.Run(network, func(t *testing.T) {
			a1, a2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
			recv := func(a netip.Addr, port int) (string, func() int) {
				var n atomic.Int64
				if network == "tcp" {
					r := newLineReceiver(t, netip.AddrPortFrom(a, uint16(port)).String())
					return r.ln.Addr().String(), func() int { return len(r.got()) }
				}
				c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, uint16(port))))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				go func() {
					buf := make([]byte, 4096)
					for {
						if _, err := c.Read(buf); err != nil {
							return
						}
						n.Add(1)
					}
				}()
				return c.LocalAddr().String(), func() int { return int(n.Load()) }
			}
			first, n1 := recv(a1, 0)
			_, port, _ := net.SplitHostPort(first)
			pn, _ := strconv.Atoi(port)
			_, n2 := recv(a2, pn)
			var current atomic.Value
			current.Store(a1)
			e := newEventSender(slog.New(slog.DiscardHandler), network, "siem.test:"+port, nil)
			e.framing = tiers.FramingLF
			e.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
				if host != "siem.test" {
					return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
				}
				return []netip.Addr{current.Load().(netip.Addr)}, nil
			}
			e.reresolve = 100 * time.Millisecond
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go e.run(ctx)
			e.send(report(0))
			waitUntil(t, func() bool { return n1() == 1 })
			current.Store(a2)
			time.Sleep(2 * e.reresolve)
			e.send(report(1))
			waitUntil(t, func() bool { return n2() == 1 })
			if n1() != 1 {
				t.Errorf("the old address got %d reports after the name moved", n1()-1)
			}
		})
	}
}
