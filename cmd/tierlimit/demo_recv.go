package main

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/traffic"
)

// demoReceiver is the demo collector: it counts the datagrams its socket
// receives and keeps the kernel's receive time of each (SO_TIMESTAMPNS) by
// the burst tag of its message (traffic.SyslogMessage), so that the demo
// shows how a window's passes spread over it from what the collector got.
type demoReceiver struct {
	conn *net.UDPConn
	n    atomic.Int64
	mu   sync.Mutex
	at   map[int][]int64 // receive times, Unix ns, by burst
	done chan struct{}
}

// newDemoReceiver receives on conn, which it owns, from now on.
func newDemoReceiver(conn *net.UDPConn) (*demoReceiver, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	r := &demoReceiver{conn: conn, at: map[int][]int64{}, done: make(chan struct{})}
	go r.receive()
	return r, nil
}

func (r *demoReceiver) receive() {
	defer close(r.done)
	buf, oob := make([]byte, 2048), make([]byte, 128)
	for {
		n, oobn, _, _, err := r.conn.ReadMsgUDP(buf, oob)
		if err != nil {
			return
		}
		r.n.Add(1)
		burst, ok := traffic.BurstOf(buf[:n])
		if !ok {
			continue
		}
		ts := kernelTime(oob[:oobn])
		r.mu.Lock()
		r.at[burst] = append(r.at[burst], ts)
		r.mu.Unlock()
	}
}

// kernelTime reads the SCM_TIMESTAMPNS control message, Unix ns; the time
// of reading when there is none.
func kernelTime(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
				sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
				nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
				return sec*1e9 + nsec
			}
		}
	}
	return time.Now().UnixNano()
}

// Count is the number of datagrams received so far.
func (r *demoReceiver) Count() int64 { return r.n.Load() }

// Received is the number of datagrams of burst received so far.
func (r *demoReceiver) Received(burst int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at[burst])
}

// Tenths returns the datagrams of burst received in each tenth of a window
// that opened at origin: element i counts those received in [origin + i ×
// window/10, origin + (i+1) × window/10). A burst that ran late has more
// than ten; one received before origin counts in the first.
func (r *demoReceiver) Tenths(burst int, origin time.Time, window time.Duration) []int {
	tenth := max(int64(window/10), 1)
	out := make([]int, 10)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ts := range r.at[burst] {
		i := int(max(ts-origin.UnixNano(), 0) / tenth)
		for len(out) <= i {
			out = append(out, 0)
		}
		out[i]++
	}
	return out
}

// Close closes the socket and waits for the receiving to stop.
func (r *demoReceiver) Close() error {
	err := r.conn.Close()
	<-r.done
	return err
}
