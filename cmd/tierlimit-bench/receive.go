package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// receiverStats is what the collector process reports: on stdin's "stats"
// line, and once more when stdin closes.
type receiverStats struct {
	// Received counts datagrams read with recvmmsg.
	Received uint64 `json:"received"`
	// Processed counts messages handed to the "application": all received
	// ones, or those the in-app limiter passed.
	Processed uint64 `json:"processed"`
	// AppDropped counts messages the in-app limiter discarded.
	AppDropped uint64 `json:"app_dropped"`
	// Windows counts windows the in-app limiter opened.
	Windows uint64 `json:"windows"`
	// Bytes sums the processed payloads.
	Bytes uint64 `json:"bytes"`
	// Malformed counts datagrams that do not start with a syslog PRI.
	Malformed uint64 `json:"malformed"`
}

// appLimiter is the seed's algorithm run after recvmmsg: a count per window
// anchored at traffic, the precompiled table, and a random discard. It is
// what the in-app comparison measures, written as a collector would.
type appLimiter struct {
	tab    tiers.Table
	window int64 // ns
	start  int64 // ns, clock of the message that opened the window
	count  uint64
	open   bool
	opened uint64
	rng    *rand.PCG
}

// admit counts one message at now (ns) and reports whether it passes.
func (l *appLimiter) admit(now int64) bool {
	if !l.open || now-l.start > l.window {
		l.open, l.start, l.count = true, now, 0
		l.opened++
	}
	l.count++
	_, thr := l.tab.Lookup(l.count)
	switch thr {
	case 0:
		return true
	case tiers.AlwaysDrop:
		return false
	}
	return !tiers.Dropped(thr, uint32(l.rng.Uint64()))
}

// runReceive is the collector process of the flood: a UDP socket read with
// recvmmsg (golang.org/x/net/ipv4 ReadBatch), a minimal syslog check per
// message, and optionally the in-app limiter. It prints "ready" once bound,
// then a JSON receiverStats line for each "stats" line on stdin, and a last
// one when stdin closes (or, with -until-signal, on SIGINT/SIGTERM), and
// exits.
func runReceive(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("receive", flag.ContinueOnError)
	addr := fs.String("addr", "0.0.0.0:514", "UDP `address` to listen on")
	limit := fs.Bool("limit", false, "run the in-app limiter (the seed's algorithm) on every message")
	max := fs.Uint64("max", 40000, "in-app limiter: selected `packets` per window")
	window := fs.Duration("window", time.Second, "in-app limiter: window length")
	rcvbuf := fs.Int("rcvbuf", 16<<20, "socket receive buffer in `bytes` (SO_RCVBUFFORCE)")
	batch := fs.Int("batch", 64, "messages per recvmmsg")
	untilSignal := fs.Bool("until-signal", false, "ignore stdin: run until SIGINT/SIGTERM, then print the counters (for a service)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}

	var lim *appLimiter
	if *limit {
		p := benchPolicy(*max, *window)
		tab, err := tiers.Compile(p, 0)
		if err != nil {
			return usageError{err}
		}
		lim = &appLimiter{tab: tab, window: window.Nanoseconds(), rng: rand.NewPCG(rand.Uint64(), rand.Uint64())}
	}

	conn, err := net.ListenPacket("udp4", *addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *addr, err)
	}
	defer conn.Close()
	if err := setRcvbuf(conn.(*net.UDPConn), *rcvbuf); err != nil {
		return err
	}
	pc := ipv4.NewPacketConn(conn)

	var c recvCounters
	readErr := make(chan error, 1)
	go func() { readErr <- c.readLoop(pc, *batch, lim) }()
	if *untilSignal {
		stdin = neverReader{}
	}
	return c.serve(ctx, stdin, stdout, readErr)
}

// recvCounters are the receiver's counters, written by readLoop and read
// by serve.
type recvCounters struct {
	received, processed, appDropped, bytes, malformed, windows atomic.Uint64
}

func (c *recvCounters) snapshot() receiverStats {
	return receiverStats{
		Received: c.received.Load(), Processed: c.processed.Load(), AppDropped: c.appDropped.Load(),
		Windows: c.windows.Load(), Bytes: c.bytes.Load(), Malformed: c.malformed.Load(),
	}
}

// readLoop reads batches of datagrams with recvmmsg, runs the in-app
// limiter (when lim is set) and the "application" on each, and counts.
// It returns the first read error.
func (c *recvCounters) readLoop(pc *ipv4.PacketConn, batch int, lim *appLimiter) error {
	msgs := make([]ipv4.Message, batch)
	for i := range msgs {
		msgs[i].Buffers = [][]byte{make([]byte, 2048)}
	}
	for {
		n, err := pc.ReadBatch(msgs, 0)
		if err != nil {
			return err
		}
		var rec, proc, drop, b, bad uint64
		for _, m := range msgs[:n] {
			rec++
			if lim != nil && !lim.admit(time.Now().UnixNano()) {
				drop++
				continue
			}
			// The "application": check the RFC 5424 PRI and account.
			if msg := m.Buffers[0][:m.N]; len(msg) < 3 || msg[0] != '<' {
				bad++
			}
			proc++
			b += uint64(m.N)
		}
		c.received.Add(rec)
		c.processed.Add(proc)
		c.appDropped.Add(drop)
		c.bytes.Add(b)
		c.malformed.Add(bad)
		if lim != nil {
			c.windows.Store(lim.opened)
		}
	}
}

// serve prints "ready", then the counters as JSON for each "stats" line on
// stdin, and once more when stdin ends or ctx is done.
func (c *recvCounters) serve(ctx context.Context, stdin io.Reader, stdout io.Writer, readErr <-chan error) error {
	out := json.NewEncoder(stdout)
	fmt.Fprintln(stdout, "ready")
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for {
		select {
		case <-ctx.Done():
			return out.Encode(c.snapshot())
		case err := <-readErr:
			return fmt.Errorf("recvmmsg: %w", err)
		case l, ok := <-lines:
			if !ok {
				return out.Encode(c.snapshot())
			}
			if l == "stats" {
				if err := out.Encode(c.snapshot()); err != nil {
					return err
				}
			}
		}
	}
}

// setRcvbuf sets SO_RCVBUFFORCE (root), so that the socket, not
// net.core.rmem_max, bounds the queue; it falls back to SO_RCVBUF.
func setRcvbuf(c *net.UDPConn, size int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
		if errors.Is(serr, syscall.EPERM) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, size)
		}
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set receive buffer: %w", serr)
	}
	return nil
}

// neverReader blocks forever: stdin for -until-signal.
type neverReader struct{}

func (neverReader) Read([]byte) (int, error) { select {} }
