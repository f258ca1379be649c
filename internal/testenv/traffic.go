package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/traffic"
)

// SyslogMessage is traffic.SyslogMessage: an RFC 5424 message tagged
// "burst=<burst> seq=<seq>".
func SyslogMessage(burst, seq int) []byte { return traffic.SyslogMessage(burst, seq) }

// priOf returns the number between a message's leading "<" and ">", or -1.
func priOf(msg []byte) int {
	end := bytes.IndexByte(msg, '>')
	if len(msg) < 3 || msg[0] != '<' || end < 2 {
		return -1
	}
	v, err := strconv.Atoi(string(msg[1:end]))
	if err != nil {
		return -1
	}
	return v
}

// Receiver is a UDP socket inside a namespace that counts the
// SyslogMessages it receives, by burst.
type Receiver struct {
	conn *net.UDPConn

	mu       sync.Mutex
	perBurst map[int]int
	perPRI   map[int]int // by the message's syslog <PRI>, -1 without one
	total    int
	bytes    int // the bytes recvmsg returned, over all datagrams
	last     time.Time
	done     chan struct{}
}

// RecvBuf is the receive buffer that Receiver forces (SO_RCVBUFFORCE): large
// enough that a whole test's passed traffic fits even if the reader stalls,
// so that the socket never drops what XDP passed.
const RecvBuf = 32 << 20

// NewReceiver listens on addr inside ns and counts datagrams until tb ends.
func NewReceiver(tb testing.TB, ns *NS, addr netip.AddrPort) *Receiver {
	tb.Helper()
	r := &Receiver{perBurst: map[int]int{}, perPRI: map[int]int{}, done: make(chan struct{})}
	err := ns.Do(func() error {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return err
		}
		r.conn = c
		return setRecvBuf(c, RecvBuf)
	})
	if err != nil {
		if r.conn != nil {
			r.conn.Close()
		}
		tb.Fatalf("receiver on %s in %s: %v", addr, ns.Name, err)
	}
	go r.loop()
	tb.Cleanup(func() {
		r.conn.Close()
		<-r.done
	})
	return r
}

func setRecvBuf(c syscall.Conn, size int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
	}); err != nil {
		return err
	}
	return serr
}

func (r *Receiver) loop() {
	defer close(r.done)
	buf := make([]byte, 64<<10)
	for {
		n, _, err := r.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		b, ok := traffic.BurstOf(buf[:n])
		pri := priOf(buf[:n])
		r.mu.Lock()
		r.total++
		r.bytes += n
		if ok {
			r.perBurst[b]++
		}
		r.perPRI[pri]++
		r.last = time.Now()
		r.mu.Unlock()
	}
}

// CountsByPRI returns the datagrams received by syslog <PRI> (-1: none).
func (r *Receiver) CountsByPRI() map[int]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[int]int, len(r.perPRI))
	for k, v := range r.perPRI {
		out[k] = v
	}
	return out
}

// WaitQuiet returns once nothing has arrived for quiet, counted from the
// call or from the last arrival, whichever is later (so traffic still on
// its way when it is called is waited for), or after limit. It reports
// whether the receiver went quiet.
func (r *Receiver) WaitQuiet(quiet, limit time.Duration) bool {
	start := time.Now()
	deadline := start.Add(limit)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		last := r.last
		r.mu.Unlock()
		if last.Before(start) {
			last = start
		}
		if time.Since(last) >= quiet {
			return true
		}
		time.Sleep(quiet / 4)
	}
	return false
}

// WaitTotal returns once want datagrams have arrived in all, or after
// limit. It reports whether they did.
func (r *Receiver) WaitTotal(want int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		r.mu.Lock()
		total := r.total
		r.mu.Unlock()
		if total >= want {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Counts returns the datagrams received per burst and in total (including
// any that were not SyslogMessages).
func (r *Receiver) Counts() (perBurst map[int]int, total int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	perBurst = make(map[int]int, len(r.perBurst))
	for k, v := range r.perBurst {
		perBurst[k] = v
	}
	return perBurst, r.total
}

// Bytes returns the datagrams received and the bytes recvmsg returned of
// them: what a collector's socket receives, the kernel's count.
func (r *Receiver) Bytes() (datagrams, bytes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total, r.bytes
}

// Sender is an unconnected UDP socket inside a namespace. Being
// unconnected, it ignores the ICMP errors that an absent listener causes,
// so every write is a datagram on the wire.
type Sender struct {
	conn *net.UDPConn
	dst  netip.AddrPort
}

// NewSender opens a UDP socket in ns that sends to dst, closed when tb ends.
func NewSender(tb testing.TB, ns *NS, dst netip.AddrPort) *Sender {
	tb.Helper()
	s := &Sender{dst: dst}
	err := ns.Do(func() error {
		var err error
		s.conn, err = net.ListenUDP("udp", nil)
		return err
	})
	if err != nil {
		tb.Fatalf("sender in %s: %v", ns.Name, err)
	}
	tb.Cleanup(func() { s.conn.Close() })
	return s
}

// Pace sends count datagrams msg(0..count-1) to the sender's destination
// with traffic.Pace: spread evenly over spread, stopping once budget has
// passed or ctx ends.
func (s *Sender) Pace(ctx context.Context, count int, spread, budget time.Duration, msg func(i int) []byte) (int, error) {
	return traffic.Pace(ctx, s.conn, s.dst, count, spread, budget, msg)
}

// Bursts describes traffic that opens exactly one window per burst: each
// burst is spread over Spread (< the window) and the next one starts
// Spread+Pause (> the window) after it, so that its first datagram is the
// first one more than a window after the previous opening.
type Bursts struct {
	Count    int           // bursts
	PerBurst int           // datagrams per burst
	Spread   time.Duration // a burst's datagrams spread over this
	Budget   time.Duration // a late burst stops after this, so that it stays in its window
	Period   time.Duration // from one burst's start to the next's
	// Message makes datagram seq of burst; nil is SyslogMessage. It must
	// keep SyslogMessage's "burst=<burst>" tag for the per-burst counts.
	Message func(burst, seq int) []byte
}

// SendBursts sends b's bursts of SyslogMessage(burst, seq) and returns how
// many datagrams each burst sent. A burst that the scheduler delays past
// Budget is cut short, never spilled into the next window; the caller
// compares each window with what its burst actually offered.
func (s *Sender) SendBursts(ctx context.Context, b Bursts) ([]int, error) {
	if b.Budget <= b.Spread || b.Period <= b.Budget {
		return nil, errors.New("bursts: want Spread < Budget < Period")
	}
	sent := make([]int, b.Count)
	next := time.Now()
	for i := range b.Count {
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return sent, ctx.Err()
			}
		}
		// Period counts from when the burst really started.
		next = time.Now().Add(b.Period)
		msg := b.Message
		if msg == nil {
			msg = SyslogMessage
		}
		n, err := s.Pace(ctx, b.PerBurst, b.Spread, b.Budget, func(seq int) []byte { return msg(i, seq) })
		sent[i] = n
		if err != nil {
			return sent, fmt.Errorf("burst %d: %w", i, err)
		}
	}
	return sent, nil
}

// Get issues an HTTP GET for url over a TCP connection dialled inside ns
// (nil: the caller's namespace), for servers that listen in a namespace: a
// plain http.Client dials from whatever thread its goroutine lands on, in
// the host's namespace.
func Get(ns *NS, url string) (status int, body []byte, err error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	var conn net.Conn
	dial := func() error {
		var err error
		conn, err = net.DialTimeout("tcp", req.URL.Host, 5*time.Second)
		return err
	}
	if ns == nil {
		err = dial()
	} else {
		err = ns.Do(dial)
	}
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req.Close = true
	if err := req.Write(conn); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes(), err
}

// SyncBuffer is a bytes.Buffer that a process's output or a logger and the
// test can share.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
