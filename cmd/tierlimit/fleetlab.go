package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/traffic"
)

// fleetLab is a fleet in namespaces (docs/design.md §12), for demo --fleet
// and the fleet's end-to-end test: a store namespace joined to members'
// collector namespaces (sandbox.Fleet), and per member a `tierlimit run`
// process in its collector namespace attached to the veth from its
// sender, a collector socket that counts what passes by window, and a
// sender. The store (redis-server in net.Store) is the caller's.
type fleetLab struct {
	bin     string // the tierlimit binary the members run
	dir     string // policies and state files
	net     *sandbox.Fleet
	members []*labMember
	// pinRoot, when set, is a directory on the host's bpffs under which
	// member i pins its state (pinRoot/i) instead of running --no-pin;
	// Close removes it.
	pinRoot string
}

// labMember is one member's collector, sender and agent process.
type labMember struct {
	pair *sandbox.Pair
	recv *demoReceiver
	send *net.UDPConn
	dst  netip.AddrPort

	mu   sync.Mutex
	proc *exec.Cmd
	log  *lockedBuffer
	done chan struct{}
}

// newFleetLab builds the namespaces for members members and opens their
// collector sockets and senders. Close removes all of it.
func newFleetLab(prefix, bin string, members int) (_ *fleetLab, err error) {
	l := &fleetLab{bin: bin}
	if l.dir, err = os.MkdirTemp("", "tierlimit-fleet-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if l.net, err = sandbox.NewFleet(prefix, members); err != nil {
		return nil, err
	}
	for _, p := range l.net.Members {
		m := &labMember{pair: p, dst: netip.AddrPortFrom(p.CollAddr, 514)}
		l.members = append(l.members, m)
		conn, _, err := sandbox.ListenUDP(p.Coll, m.dst, 8<<20)
		if err != nil {
			return nil, fmt.Errorf("collector socket in %s: %w", p.Coll.Name, err)
		}
		if m.recv, err = newDemoReceiver(conn); err != nil {
			conn.Close()
			return nil, err
		}
		if err := p.Send.Do(func() (err error) { m.send, err = net.ListenUDP("udp", nil); return err }); err != nil {
			return nil, fmt.Errorf("sender in %s: %w", p.Send.Name, err)
		}
	}
	return l, nil
}

// writePolicy writes policy to a file in the lab's directory.
func (l *fleetLab) writePolicy(name, policy string) (string, error) {
	path := filepath.Join(l.dir, name)
	return path, os.WriteFile(path, []byte(policy), 0o644)
}

// start runs `tierlimit run` for member i under the member name name
// with the policy file config, detached when it stops (--no-pin; with
// pinRoot, pinned under pinRoot/i and left attached), its
// metrics on 127.0.0.1:9713 in its namespace; it waits (bounded) for the
// started line, and for want in the log when want is not empty.
func (l *fleetLab) start(i int, name, config, want string) error {
	m := l.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		return fmt.Errorf("member %d runs already", i)
	}
	m.log = &lockedBuffer{}
	pin := []string{"--no-pin"}
	if l.pinRoot != "" {
		pin = []string{"--pin-path", filepath.Join(l.pinRoot, fmt.Sprint(i))}
	}
	args := append([]string{"run", "--iface", m.pair.CollIf, "--config", config}, pin...)
	cmd := m.pair.Coll.Command(context.Background(), l.bin, append(args,
		"--metrics-addr", "127.0.0.1:9713", "--fleet-member", name, "--state-file", "")...)
	cmd.Stdout, cmd.Stderr = m.log, m.log
	// Pdeathsig: the member dies with its parent even when the parent is
	// killed before Close.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	m.proc, m.done = cmd, make(chan struct{})
	done := m.done
	go func() { cmd.Wait(); close(done) }()
	for _, w := range []string{"msg=started", want} {
		if w == "" {
			continue
		}
		if !waitLogLine(m.log, done, w, 15*time.Second) {
			return fmt.Errorf("member %d (%s): no %q in its log within 15s:\n%s", i, name, w, m.log)
		}
	}
	return nil
}

// waitLogLine waits (bounded) for s in log, or for the process to end.
func waitLogLine(log *lockedBuffer, done <-chan struct{}, s string, limit time.Duration) bool {
	for end := time.Now().Add(limit); time.Now().Before(end); {
		if strings.Contains(log.String(), s) {
			return true
		}
		select {
		case <-done:
			return strings.Contains(log.String(), s)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false
}

// stop sends member i's agent sig and waits (bounded) for it to end;
// SIGKILL after 10 s.
func (l *fleetLab) stop(i int, sig syscall.Signal) error {
	m := l.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return nil
	}
	proc, done := m.proc, m.done
	m.proc = nil
	proc.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		proc.Process.Kill()
		<-done
		return fmt.Errorf("member %d did not stop within 10s of %v", i, sig)
	}
}

// signal sends member i's agent sig (SIGHUP: reload), if it runs.
func (l *fleetLab) signal(i int, sig syscall.Signal) error {
	m := l.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return fmt.Errorf("member %d does not run", i)
	}
	return m.proc.Process.Signal(sig)
}

// logOf returns member i's agent log so far.
func (l *fleetLab) logOf(i int) string {
	m := l.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.log == nil {
		return ""
	}
	return m.log.String()
}

// flood sends, from every member's sender at once, rates(k)[i] datagrams
// in window k to member i for windows windows, window k's datagrams
// tagged burst first+k and spread over the window from a common start. It
// returns what each member's sender sent per window.
func (l *fleetLab) flood(ctx context.Context, first, windows int, window time.Duration, rates func(k int) []int) ([][]int, error) {
	sent := make([][]int, len(l.members))
	errs := make([]error, len(l.members))
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range l.members {
		sent[i] = make([]int, windows)
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := l.members[i]
			for k := range windows {
				select {
				case <-time.After(time.Until(t0.Add(time.Duration(k) * window))):
				case <-ctx.Done():
					return
				}
				msg := func(seq int) []byte { return traffic.SyslogMessage(first+k, seq) }
				n, err := traffic.Pace(ctx, m.send, m.dst, rates(k)[i], window*97/100, window*99/100, msg)
				sent[i][k] = n
				if err != nil && ctx.Err() == nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return sent, err
		}
	}
	return sent, ctx.Err()
}

// passed returns what member i's collector received of window burst.
func (l *fleetLab) passed(i, burst int) int {
	r := l.members[i].recv
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at[burst])
}

// settle waits (bounded) until no member's collector has received
// anything for quiet.
func (l *fleetLab) settle(quiet time.Duration) {
	last := int64(-1)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(quiet) {
		var n int64
		for _, m := range l.members {
			n += m.recv.Count()
		}
		if n == last {
			return
		}
		last = n
	}
}

// metrics scrapes member i's /metrics (metricValues).
func (l *fleetLab) metrics(i int) (map[string]float64, error) {
	ns := l.members[i].pair.Coll
	var conn net.Conn
	if err := ns.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", "127.0.0.1:9713", 2*time.Second)
		return err
	}); err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:9713/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return metricValues(resp.Body)
}

// metricValues parses a /metrics body: name{label=value,...} -> value, for
// counters and gauges.
func metricValues(r io.Reader) (map[string]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := name
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			}
		}
	}
	return out, nil
}

// Close stops the agents, closes the sockets and removes the namespaces
// and the lab's directory.
func (l *fleetLab) Close() error {
	for i := range l.members {
		l.stop(i, syscall.SIGTERM)
	}
	for _, m := range l.members {
		if m.recv != nil {
			m.recv.Close()
		}
		if m.send != nil {
			m.send.Close()
		}
	}
	var err error
	if l.net != nil {
		err = l.net.Close()
	}
	os.RemoveAll(l.dir)
	if l.pinRoot != "" {
		os.RemoveAll(l.pinRoot) // the links went with the namespaces
	}
	return err
}

// lockedBuffer is a bytes.Buffer safe for a process's output and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// cut cuts member i off from the store, or joins it again (on false): an
// nftables table in its collector namespace drops every packet to and
// from the store's address, as a partition does (no refusal: the
// member's connections hang until their deadlines). It needs nft.
func (l *fleetLab) cut(i int, on bool) error {
	script := "delete table inet tlchaos\n"
	if on {
		a := l.net.StoreAddr.String()
		script = "table inet tlchaos {\n" +
			"  chain out { type filter hook output priority 0; ip daddr " + a + " drop; }\n" +
			"  chain in { type filter hook input priority 0; ip saddr " + a + " drop; }\n}\n"
	}
	cmd := l.members[i].pair.Coll.Command(context.Background(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in member %d's namespace: %v: %s", i, err, out)
	}
	return nil
}
