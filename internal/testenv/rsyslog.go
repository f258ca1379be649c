package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Rsyslog is an rsyslogd (the Debian package) running in a namespace with
// only imudp on one address and an omfile action writing every message to
// Out: no imuxsock, no imklog, nothing of the host's configuration.
type Rsyslog struct {
	Out string
	cmd *exec.Cmd
	log *bytes.Buffer
}

// RequireRsyslog skips tb when rsyslogd is not installed, or fails it under
// TIERLIMIT_REQUIRE_BPF=1, where CI has installed it.
func RequireRsyslog(tb testing.TB) string {
	tb.Helper()
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, "rsyslogd")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("rsyslogd"); err == nil {
		return p
	}
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("rsyslogd not installed (apt-get install rsyslog)")
	}
	tb.Skip("rsyslogd not installed (apt-get install rsyslog)")
	return ""
}

// StartRsyslog runs rsyslogd in ns listening on UDP addr, writing messages
// to a file in a temporary directory, and waits until its socket is bound.
// tb.Cleanup stops it (SIGTERM, then SIGKILL) and waits for it: call it
// after the namespace was made, so that it stops before the namespace goes.
func StartRsyslog(tb testing.TB, ns *NS, addr netip.AddrPort) *Rsyslog {
	tb.Helper()
	return startRsyslog(tb, ns, addr, "udp", fileFormat)
}

// StartRsyslogRaw is StartRsyslog writing each message as it came, its
// raw bytes (%rawmsg%: the UDP payload, unparsed) and a line feed, so that
// the file's bytes less one a line are the payload bytes it received.
// The messages must hold no line feed and no NUL (rsyslog escapes control
// characters).
func StartRsyslogRaw(tb testing.TB, ns *NS, addr netip.AddrPort) *Rsyslog {
	tb.Helper()
	return startRsyslog(tb, ns, addr, "udp", rawFormat)
}

// The omfile templates: rsyslog's file format, and the raw message.
const (
	fileFormat = `template="RSYSLOG_FileFormat"`
	rawFormat  = `template="tlraw"`
	rawDecl    = `template(name="tlraw" type="string" string="%rawmsg%\n")` + "\n"
)

// StartRsyslogTCP is StartRsyslog listening on TCP addr (imtcp), which
// takes octet-counted and line-feed framed messages (RFC 6587 §3.4).
func StartRsyslogTCP(tb testing.TB, ns *NS, addr netip.AddrPort) *Rsyslog {
	tb.Helper()
	return startRsyslog(tb, ns, addr, "tcp", fileFormat)
}

func startRsyslog(tb testing.TB, ns *NS, addr netip.AddrPort, proto, template string) *Rsyslog {
	tb.Helper()
	bin := RequireRsyslog(tb)
	dir := tb.TempDir()
	r := &Rsyslog{Out: filepath.Join(dir, "messages.log"), log: &bytes.Buffer{}}
	conf := filepath.Join(dir, "rsyslog.conf")
	// rcvbufSize: a burst passed by XDP must fit the socket even if
	// rsyslog's reader lags; rsyslogd forces it (SO_RCVBUFFORCE) as root.
	input := fmt.Sprintf(`module(load="imudp")
input(type="imudp" address=%q port="%d" rcvbufSize="16m")`, addr.Addr().String(), addr.Port())
	if proto == "tcp" {
		input = fmt.Sprintf(`module(load="imtcp")
input(type="imtcp" address=%q port="%d")`, addr.Addr().String(), addr.Port())
	}
	decl := ""
	if template == rawFormat {
		decl = rawDecl
	}
	cfg := fmt.Sprintf(`global(workDirectory=%q)
%s
%s*.* action(type="omfile" file=%q %s)
`, dir, input, decl, r.Out, template)
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cmd = ns.Command(ctx, bin, "-n", "-f", conf, "-i", filepath.Join(dir, "rsyslogd.pid"))
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	r.cmd.Cancel = func() error { return r.cmd.Process.Signal(syscall.SIGTERM) }
	r.cmd.WaitDelay = 5 * time.Second
	if err := r.cmd.Start(); err != nil {
		cancel()
		tb.Fatalf("start rsyslogd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- r.cmd.Wait() }()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			tb.Errorf("rsyslogd (pid %d) did not stop", r.cmd.Process.Pid)
		}
	})
	// Ready once the socket is bound in ns: /proc/net/udp as seen from ns.
	port := fmt.Sprintf(":%04X ", addr.Port())
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			tb.Fatalf("rsyslogd exited at start: %v; output: %s", err, r.log)
		default:
		}
		out, err := ns.Command(context.Background(), "cat", "/proc/net/"+proto).Output()
		if err == nil && strings.Contains(string(out), port) {
			r.checkModules(tb, "/im"+proto+".so")
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("rsyslogd did not bind %s within 10s; output: %s", addr, r.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkModules fails tb if rsyslogd loaded an input module other than
// input (imudp or imtcp): imuxsock or imklog would read the host's logs,
// not the test's.
func (r *Rsyslog) checkModules(tb testing.TB, input string) {
	tb.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", r.cmd.Process.Pid))
	if err != nil {
		tb.Fatalf("rsyslogd modules: %v", err)
	}
	if !bytes.Contains(maps, []byte(input)) {
		tb.Fatalf("rsyslogd has not loaded %s", input)
	}
	for _, m := range []string{"/imuxsock.so", "/imklog.so", "/imjournal.so"} {
		if bytes.Contains(maps, []byte(m)) {
			tb.Fatalf("rsyslogd loaded %s: the config must load %s only", m, input)
		}
	}
}

// Count returns how many lines of the output file contain marker.
func (r *Rsyslog) Count(marker string) (int, error) {
	b, err := os.ReadFile(r.Out)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return bytes.Count(b, []byte(marker)), nil
}

// WaitCount polls the output file until the count of lines containing
// marker reaches want, or stops changing for quiet, or limit passes, and
// returns the last count.
func (r *Rsyslog) WaitCount(marker string, want int, quiet, limit time.Duration) (int, error) {
	deadline := time.Now().Add(limit)
	last, since := -1, time.Now()
	for {
		n, err := r.Count(marker)
		if err != nil {
			return n, err
		}
		if n >= want {
			return n, nil
		}
		if n != last {
			last, since = n, time.Now()
		} else if n > 0 && time.Since(since) >= quiet {
			return n, nil
		}
		if time.Now().After(deadline) {
			return n, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Logger sends lines (one message each) with util-linux logger from ns to
// the syslog server at dst over UDP, in RFC 5424 format, tagged tag.
func Logger(ctx context.Context, ns *NS, dst netip.AddrPort, tag string, lines []string) error {
	cmd := ns.Command(ctx, "logger", "--udp", "--server", dst.Addr().String(), "--port", fmt.Sprint(dst.Port()),
		"--rfc5424", "--tag", tag, "--priority", "local0.info")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("logger: %w: %s", err, out)
	}
	return nil
}
