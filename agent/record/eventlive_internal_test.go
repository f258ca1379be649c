package record

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// nsReceiver is a TCP syslog receiver (line feed framing) listening in a
// namespace; vanish closes it with no FIN reaching the sender.
type nsReceiver struct {
	ln    net.Listener
	mu    sync.Mutex
	lines []string
	conns []*net.TCPConn
}

func listenIn(t *testing.T, ns *testenv.NS, addr netip.AddrPort) *nsReceiver {
	t.Helper()
	r := &nsReceiver{}
	if err := ns.Do(func() (err error) { r.ln, err = net.Listen("tcp", addr.String()); return err }); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := r.ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, c.(*net.TCPConn))
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
	t.Cleanup(r.vanish)
	return r
}

func (r *nsReceiver) got() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lines)
}

// vanish closes the listener and its connections with a reset (linger
// 0), which the caller keeps from the sender by taking the link down
// first: the host is gone as a crash or a partition leaves it.
func (r *nsReceiver) vanish() {
	r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.SetLinger(0)
		c.Close()
	}
}

// setLink sets the collector end of the pair up or down: down, nothing
// the sender writes arrives, and nothing answers (no FIN, no reset).
func setLink(t *testing.T, p *testenv.Pair, up bool) {
	t.Helper()
	if err := p.Coll.Do(func() error {
		l, err := netlink.LinkByName(p.CollIf)
		if err != nil {
			return err
		}
		if up {
			return netlink.LinkSetUp(l)
		}
		return netlink.LinkSetDown(l)
	}); err != nil {
		t.Fatal(err)
	}
}

// runIn runs the sender on a thread in ns, so that its sockets are ns's.
func runIn(t *testing.T, ns *testenv.NS, e *eventSender) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ns.Do(func() error { e.run(ctx); return nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEventSenderPeerVanishes (issue 43 B74): on the real kernel, a TCP
// receiver whose host vanishes with no FIN or reset (the link down) does
// not get reports counted sent: they count once acknowledged. When a new
// receiver comes up at the address (the old connection is reset by its
// kernel), the unacknowledged reports are written once more on a new
// connection and arrive; when none does, the kernel gives up on the dead
// peer within eventUserTimeout (TCP_USER_TIMEOUT) and each report is
// counted as an error, none as sent.
func TestEventSenderPeerVanishes(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	addr := netip.AddrPortFrom(p.CollAddr, 6514)
	r := listenIn(t, p.Coll, addr)
	e := newEventSender(slog.New(slog.DiscardHandler), "tcp", addr.String(), nil)
	e.framing = tiers.FramingLF
	runIn(t, p.Send, e)
	for i := range 5 {
		e.send(report(i))
	}
	waitFor(t, 5*time.Second, "5 reports sent", func() bool { return r.got() == 5 && e.sent.Load() == 5 })

	// The host vanishes, and comes back as a new receiver.
	setLink(t, p, false)
	r.vanish()
	for i := range 4 {
		e.send(report(10 + i))
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if n := e.sent.Load(); n != 5 {
		t.Errorf("%d reports counted sent while the receiver was gone, want 5 (the first five)", n)
	}
	r2 := listenIn(t, p.Coll, addr)
	setLink(t, p, true)
	waitFor(t, 15*time.Second, "the new receiver gets the 4 unacknowledged reports", func() bool { return r2.got() == 4 })
	waitFor(t, 5*time.Second, "9 counted sent", func() bool { return e.sent.Load() == 9 })

	// The host vanishes for good: 3 reports, each counted as an error.
	setLink(t, p, false)
	r2.vanish()
	start := time.Now()
	for i := range 3 {
		e.send(report(20 + i))
	}
	waitFor(t, 3*eventUserTimeout, "3 errors", func() bool { return e.errs.Load() == 3 })
	t.Logf("dead peer found and the resend refused %v after the reports", time.Since(start).Round(100*time.Millisecond))
	if n := e.sent.Load(); n != 9 {
		t.Errorf("%d counted sent, want 9", n)
	}
}

// TestEventSenderEveryAddress (issue 43 B75): events.syslog names a host
// with an AAAA and an A record, and the receiver listens on IPv4 only. On
// the real kernel, the IPv6 address answers ICMPv6 port unreachable, the
// sender moves to the IPv4 one, and every report arrives; the log says
// once which address is used and never flaps.
func TestEventSenderEveryAddress(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	var pc net.PacketConn
	if err := p.Coll.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(p.CollAddr, 5514).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var got atomic.Int64
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	// The IPv6 neighbour resolved first, as on a network in use: on a
	// fresh veth the first datagrams wait for it (and for DAD of the
	// link-local addresses), and no ICMP comes back meanwhile.
	waitFor(t, 10*time.Second, "the collector's IPv6 address answers ping", func() bool {
		return p.Send.Command(context.Background(), "ping", "-6", "-c1", "-W1", p.CollAddr6.String()).Run() == nil
	})
	var logs syncBuffer
	e := newEventSender(slog.New(slog.NewTextHandler(&logs, nil)), "udp", "siem.test:5514", nil)
	e.resolve = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{p.CollAddr6, p.CollAddr}, nil // RFC 6724 order: IPv6 first
	}
	runIn(t, p.Send, e)
	for i := range 6 {
		e.send(report(i))
		time.Sleep(100 * time.Millisecond)
	}
	deadline := time.Now().Add(10 * time.Second)
	for got.Load() != 6 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got.Load() != 6 {
		t.Fatalf("%d of 6 reports arrived; sent %d, errors %d; log:\n%s", got.Load(), e.sent.Load(), e.errs.Load(), logs.String())
	}
	waitFor(t, 5*time.Second, "6 counted sent", func() bool { return e.sent.Load() == 6 })
	out := logs.String()
	if n := strings.Count(out, "reports go to"); n != 1 || !strings.Contains(out, "reports go to "+p.CollAddr.String()) {
		t.Errorf("the log says %d times where reports go, want once, the IPv4 address:\n%s", n, out)
	}
	if strings.Contains(out, "report not sent") || e.errs.Load() != 0 {
		t.Errorf("errors %d:\n%s", e.errs.Load(), out)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
