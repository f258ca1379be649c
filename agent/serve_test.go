package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// testMux serves /healthz, and /slow, which signals started and waits for
// release.
func testMux(started chan<- struct{}, release <-chan struct{}) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		io.WriteString(w, "done\n")
	})
	return mux
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func get(addr, path string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestServeCapsIdleConns (issue 11 case 8): 5 × the cap of idle
// connections, new and kept alive, do not stop /healthz, and the server
// holds no more than the cap: it has closed the others.
func TestServeCapsIdleConns(t *testing.T) {
	const max, idle = 8, 40
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := serveHTTP(ctx, ln, testMux(nil, nil), max, slog.New(slog.DiscardHandler))
	defer func() { cancel(); <-done }()
	addr := ln.Addr().String()
	var conns []net.Conn
	for i := range idle {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if i%2 == 1 { // a kept-alive connection after one request
			io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			buf := make([]byte, 512)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := c.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "200 OK") {
				t.Fatalf("keep-alive request %d: %q %v", i, buf[:n], err)
			}
		}
		conns = append(conns, c)
	}
	if body, err := get(addr, "/healthz"); err != nil || body != "ok\n" {
		t.Fatalf("/healthz under %d idle connections: %q %v", idle, body, err)
	}
	closed := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	// The /healthz connection took one slot and was closed again.
	if open := idle - closed; open > max {
		t.Fatalf("%d of %d idle connections still open, cap %d", open, idle, max)
	}
}

// TestServeBusyConnsKept: at the cap with every connection in a request,
// a new connection is refused, none in progress is cut, and once they end
// the server answers again.
func TestServeBusyConnsKept(t *testing.T) {
	const max = 4
	ln := listen(t)
	started, release := make(chan struct{}, max), make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := serveHTTP(ctx, ln, testMux(started, release), max, slog.New(slog.DiscardHandler))
	defer func() { cancel(); <-done }()
	addr := ln.Addr().String()
	results := make(chan string, max)
	for range max {
		go func() { body, _ := get(addr, "/slow"); results <- body }()
	}
	for range max {
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatal("slow requests did not start")
		}
	}
	if body, err := get(addr, "/healthz"); err == nil {
		t.Fatalf("a request over the cap of busy connections was served: %q", body)
	}
	close(release)
	for range max {
		if body := <-results; body != "done\n" {
			t.Fatalf("a request in progress was cut: %q", body)
		}
	}
	if body, err := get(addr, "/healthz"); err != nil || body != "ok\n" {
		t.Fatalf("/healthz after: %q %v", body, err)
	}
}

// TestServeCleanShutdown (issue 11 D): the listener closed right after ctx
// ends, as run's deferred close did, logs no error; 50 rounds.
func TestServeCleanShutdown(t *testing.T) {
	logs := &testenv.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	for range 50 {
		ln := listen(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := serveHTTP(ctx, ln, testMux(nil, nil), 4, log)
		if body, err := get(ln.Addr().String(), "/healthz"); err != nil || body != "ok\n" {
			t.Fatalf("/healthz: %q %v", body, err)
		}
		cancel()
		ln.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("server did not stop")
		}
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("errors at clean shutdown:\n%s", logs)
	}
}
