package record

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// Episode reports leave as RFC 5424 messages with structured data under a
// private SD-ID: shed@32473 (32473 is the example enterprise number of RFC
// 5612), over UDP (one message per datagram, RFC 5426) or TCP with
// octet-counting framing (RFC 6587 §3.4.1) or, with events.framing: lf,
// non-transparent framing (§3.4.2).
const (
	sdID = "shed@32473"
	// eventQueue bounds the reports waiting for the destination: a
	// report that finds it full is counted as an error and dropped, so a
	// dead destination never blocks the agent.
	eventQueue = 64
	// eventTimeout bounds a dial or a write.
	eventTimeout = 2 * time.Second
	// facility 4: security/authorization messages (RFC 5424 §6.2.1).
	eventFacility = 4
)

// sdParam is one PARAM-NAME="PARAM-VALUE" of the structured data.
type sdParam struct{ name, value string }

// sdEscape escapes '"', '\' and ']' in a PARAM-VALUE (RFC 5424 §6.3.3).
func sdEscape(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, `]`, `\]`).Replace(v)
}

// formatRFC5424 renders one message: <PRI>1 TIMESTAMP HOSTNAME APP-NAME
// PROCID MSGID [shed@32473 ...] MSG.
func formatRFC5424(sev int, ts time.Time, host, msgID string, params []sdParam, msg string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "<%d>1 %s %s tierlimit %d %s [%s", eventFacility*8+sev,
		ts.UTC().Format("2006-01-02T15:04:05.000000Z"), nilValue(host), os.Getpid(), msgID, sdID)
	for _, p := range params {
		fmt.Fprintf(&b, ` %s="%s"`, p.name, sdEscape(p.value))
	}
	b.WriteString("] ")
	b.WriteString(msg)
	return []byte(b.String())
}

// nilValue is "-" for an empty header field, and the field with spaces and
// non-printing characters removed otherwise (RFC 5424 §6: PRINTUSASCII).
func nilValue(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 33 || r > 126 {
			return -1
		}
		return r
	}, s)
	if s == "" {
		return "-"
	}
	return s
}

// eventSender sends reports to events.syslog from its own goroutine, off
// any path the agent waits on: send queues, run dials and writes. A failed
// dial or write counts an error, drops that report and closes the
// connection; the next report dials again, so reports resume when the
// destination returns. A reload that changes the destination stops the
// old sender: it sends what it has queued, then ends.
type eventSender struct {
	log           *slog.Logger
	network, addr string
	q             chan []byte
	done          chan struct{} // closed by stop
	*eventCounts
	failing bool // the last report was not sent (run's own)
	// framing is events.framing for TCP: tiers.FramingLF, or
	// octet-counted.
	framing string
	// resolve looks up addr's host at each dial and every reresolve
	// (eventdial.go); dialed is when the connection was made (run's own).
	resolve   func(ctx context.Context, host string) ([]netip.Addr, error)
	reresolve time.Duration
	dialed    time.Time
	// pending are the TCP reports written and not yet acknowledged,
	// written the bytes written on the connection (eventlive.go).
	pending []pendingReport
	written uint64
	// used is the address reports go to, logged when it changes;
	// refused the UDP addresses that answered ICMP unreachable
	// (eventdial.go). run's own.
	used    netip.AddrPort
	refused map[netip.Addr]bool
}

// eventCounts are the reports sent and not sent (event_reports_total):
// the senders of one Episodes share them across reloads.
type eventCounts struct{ sent, errs atomic.Uint64 }

// newEventSender makes a sender to network and addr that counts into c
// (nil: counts of its own).
func newEventSender(log *slog.Logger, network, addr string, c *eventCounts) *eventSender {
	if c == nil {
		c = &eventCounts{}
	}
	return &eventSender{log: log, network: network, addr: addr, q: make(chan []byte, eventQueue), done: make(chan struct{}), eventCounts: c,
		resolve: lookupHost, reresolve: eventReresolve}
}

// send queues msg, or counts an error when the queue is full.
func (e *eventSender) send(msg []byte) {
	select {
	case e.q <- msg:
	default:
		e.errs.Add(1)
	}
}

// stop makes run send the reports it has queued and end. Call it once,
// after the last send.
func (e *eventSender) stop() { close(e.done) }

func (e *eventSender) run(ctx context.Context) {
	var conn net.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		var poll <-chan time.Time
		if len(e.pending) > 0 {
			poll = time.After(eventAckPoll)
		}
		select {
		case <-ctx.Done():
			e.settle(ctx, &conn)
			return
		case <-poll:
			e.settle(ctx, &conn)
		case <-e.done:
			for {
				select {
				case msg := <-e.q:
					e.deliver(ctx, &conn, msg)
					continue
				default:
				}
				break
			}
			// What is written waits for its acknowledgement as long as
			// a dead peer takes to be found, and is then resent once.
			deadline := time.Now().Add(2*eventUserTimeout + 2*eventTimeout)
			for len(e.pending) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(eventAckPoll)
				e.settle(ctx, &conn)
			}
			e.drop(&conn)
			return
		case msg := <-e.q:
			e.deliver(ctx, &conn, msg)
		}
	}
}

// deliver writes one report, and counts it sent or an error. Over TCP it
// counts as sent once acknowledged (settle); a connection that breaks
// under the write is dialled again and the report, with those not yet
// acknowledged, written once more: only a report that the new
// connection refuses too is lost. Over UDP a destination that answers
// ICMP unreachable gives way to the name's next address (writeUDP).
func (e *eventSender) deliver(ctx context.Context, conn *net.Conn, msg []byte) {
	if e.network != "tcp" {
		if err := e.writeUDP(ctx, conn, msg); err != nil {
			e.errs.Add(1)
			if *conn != nil {
				(*conn).Close()
				*conn = nil
			}
			e.fail(err)
			return
		}
		e.sent.Add(1)
		e.ok()
		return
	}
	e.settle(ctx, conn)
	if err := e.writeTCP(ctx, conn, pendingReport{msg: msg}); err != nil {
		if *conn == nil { // no connection to be had: this one is lost
			e.errs.Add(1)
			e.fail(err)
			return
		}
		e.pending = append(e.pending, pendingReport{msg: msg})
		e.reconnect(ctx, conn)
	}
}

// fail logs the first report not sent of a run of them.
func (e *eventSender) fail(err error) {
	if !e.failing {
		e.log.Warn("events: report not sent; counting errors until the destination takes them", "syslog", e.network+"://"+e.addr, "error", err,
			"hint", sendHint(err))
	}
	e.failing = true
}

// ok logs the first report sent after a run of failures.
func (e *eventSender) ok() {
	if e.failing {
		e.log.Info("events: reports sent again", "syslog", e.network+"://"+e.addr)
	}
	e.failing = false
}
