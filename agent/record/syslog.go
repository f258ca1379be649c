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
		select {
		case <-ctx.Done():
			return
		case <-e.done:
			for {
				select {
				case msg := <-e.q:
					e.deliver(ctx, &conn, msg)
				default:
					return
				}
			}
		case msg := <-e.q:
			e.deliver(ctx, &conn, msg)
		}
	}
}

// deliver writes one report, and counts it sent or an error. A TCP
// connection that breaks under the write (the receiver restarted since
// the last report) is dialled again and the report written once more:
// only a report that the new connection refuses too is lost.
func (e *eventSender) deliver(ctx context.Context, conn *net.Conn, msg []byte) {
	err := e.write(ctx, conn, msg)
	if err != nil && e.network == "tcp" && *conn != nil {
		(*conn).Close()
		*conn = nil
		err = e.write(ctx, conn, msg)
	}
	if err != nil {
		e.errs.Add(1)
		if *conn != nil {
			(*conn).Close()
			*conn = nil
		}
		if !e.failing {
			e.log.Warn("events: report not sent; counting errors until the destination takes them", "syslog", e.network+"://"+e.addr, "error", err,
				"hint", sendHint(err))
		}
		e.failing = true
		return
	}
	if e.failing {
		e.log.Info("events: reports sent again", "syslog", e.network+"://"+e.addr)
	}
	e.failing = false
	e.sent.Add(1)
}

func (e *eventSender) write(ctx context.Context, conn *net.Conn, msg []byte) error {
	if *conn != nil && e.stale(ctx, *conn) {
		(*conn).Close()
		*conn = nil
	}
	if *conn == nil {
		c, err := e.dial(ctx)
		if err != nil {
			return err
		}
		*conn, e.dialed = c, time.Now()
	}
	if e.network == "tcp" {
		msg = frame(e.framing, msg)
	}
	(*conn).SetWriteDeadline(time.Now().Add(eventTimeout))
	_, err := (*conn).Write(msg)
	return err
}
