package fleet

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// alertWait bounds the read for a refusal's alert after a write met a
// reset: the alert, when there is one, is already in the socket's receive
// queue, so the read returns at once; the bound only keeps a peer that
// sent nothing from holding the write.
const alertWait = 100 * time.Millisecond

// alertConn is a TLS connection that names the server's refusal of the
// client certificate even when a reset arrives before the write that
// would have read it.
//
// In TLS 1.3 the client's handshake is complete once it has sent its
// Finished; the server judges the client's certificate after that (RFC 8446
// §4.4.2.4) and answers a refusal with an alert and a close. The alert
// reaches the client's receive queue first; when the client's next bytes
// (go-redis's HELLO) reach the closed socket, the server's kernel answers
// with a reset, and a write after it fails with ECONNRESET (or EPIPE)
// although the alert sits unread. Write then reads once, under alertWait,
// and returns the alert's error (crypto/tls's net.OpError "remote error",
// "remote error: tls: …", which refusal reads as a refusal of the
// credentials) with the write's error beside it.
// Any other error, and a reset with no alert before it, is returned as it
// was.
type alertConn struct{ *tls.Conn }

func (c alertConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err == nil || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		return n, err
	}
	if c.Conn.SetReadDeadline(time.Now().Add(alertWait)) != nil {
		return n, err
	}
	var one [1]byte
	var alert *net.OpError
	if _, rerr := c.Conn.Read(one[:]); errors.As(rerr, &alert) && alert.Op == "remote error" {
		return n, fmt.Errorf("%w (the write before it: %w)", rerr, err)
	}
	return n, err
}
