package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultMetricsAddr is where /metrics listens unless told otherwise.
const DefaultMetricsAddr = "127.0.0.1:9713"

// MaxMetricsConns is how many connections the metrics server holds at
// once. A connection over the cap makes room by closing the one that has
// been idle longest (connected with no request in progress, new or kept
// alive); when every connection has a request in progress, the new one is
// closed. So idle keep-alive connections cannot exhaust the agent's file
// descriptors, and /healthz stays reachable under them.
const MaxMetricsConns = 64

// Metrics server timeouts: a request's headers must arrive within
// metricsHeaderTimeout, a kept-alive connection is closed after
// metricsIdleTimeout without a request, and a response must be written
// within metricsWriteTimeout (promhttp's own timeout is 10 s).
const (
	metricsHeaderTimeout = 5 * time.Second
	metricsIdleTimeout   = 30 * time.Second
	metricsWriteTimeout  = 15 * time.Second
)

// Serve serves Handler on ln, holding at most MaxMetricsConns connections,
// until ctx ends; then it shuts the server down (2 s grace) and closes ln.
// It returns at once, with a channel closed once the server has stopped.
// Errors are logged; closing ln at shutdown is none.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) <-chan struct{} {
	return serveHTTP(ctx, ln, a.Handler(), MaxMetricsConns, a.log)
}

func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, maxConns int, log *slog.Logger) <-chan struct{} {
	capped := &connCap{Listener: ln, max: maxConns, conns: map[*capConn]bool{}}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: metricsHeaderTimeout,
		IdleTimeout:       metricsIdleTimeout,
		WriteTimeout:      metricsWriteTimeout,
		ConnState:         capped.track,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		err := srv.Serve(capped)
		// Serve returns ErrServerClosed once Shutdown has begun; a listener
		// closed by ctx's end races with that and is no error either.
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !(ctx.Err() != nil && errors.Is(err, net.ErrClosed)) {
			log.Error("metrics server", "error", err)
		}
	}()
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
		case <-served:
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		<-served
	}()
	return done
}

// connCap is a listener holding at most max connections (MaxMetricsConns).
type connCap struct {
	net.Listener
	max int

	mu sync.Mutex
	// conns holds the open connections: true while a request is in progress.
	conns map[*capConn]bool
}

// capConn is a connection of a connCap; idle since the time of its last
// state change to new or idle.
type capConn struct {
	net.Conn
	cap       *connCap
	idleSince time.Time
	once      sync.Once
}

func (c *capConn) Close() error {
	c.once.Do(func() {
		c.cap.mu.Lock()
		delete(c.cap.conns, c)
		c.cap.mu.Unlock()
	})
	return c.Conn.Close()
}

// Accept returns the next connection, closing the longest-idle one first
// when at the cap, or closing the new one when none is idle.
func (l *connCap) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &capConn{Conn: nc, cap: l, idleSince: time.Now()}
		l.mu.Lock()
		var victim *capConn
		if len(l.conns) >= l.max {
			for o, busy := range l.conns {
				if !busy && (victim == nil || o.idleSince.Before(victim.idleSince)) {
					victim = o
				}
			}
			if victim == nil {
				l.mu.Unlock()
				nc.Close()
				continue
			}
			delete(l.conns, victim)
		}
		l.conns[c] = false
		l.mu.Unlock()
		if victim != nil {
			victim.Close()
		}
		return c, nil
	}
}

// track is the server's ConnState hook: it marks requests in progress.
func (l *connCap) track(nc net.Conn, s http.ConnState) {
	c, ok := nc.(*capConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, open := l.conns[c]; !open {
		return
	}
	switch s {
	case http.StateActive:
		l.conns[c] = true
	case http.StateNew, http.StateIdle:
		l.conns[c] = false
		c.idleSince = time.Now()
	case http.StateHijacked, http.StateClosed:
		delete(l.conns, c)
	}
}

// Registry returns a registry with the agent's collector and the Go and
// process collectors.
func (a *Agent) Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.Collector(), fleetCollector{a}, licenseCollector{a}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves /metrics (promhttp, with a timeout and a limit on
// concurrent scrapes) and /healthz, which is 200 only while the limiter is
// attached to every interface.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.Registry(), promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if !a.Attached() {
			http.Error(w, "not attached\n", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}
