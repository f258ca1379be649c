package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// Reload and restart under traffic: the policy follows each reload, a
// SIGKILLed agent's pinned state goes on limiting and is adopted, and
// nothing in flight is lost. Shared helpers are in lifecycle_test.go.

// TestReloadUnderFlood switches a flooded agent between a lenient and a
// strict policy 20 times by rewriting its config file (saved by rename):
// the passed rate follows each policy within one window, every reload
// counts as a success, and no counter ever decreases. Then a bad file is
// refused, with the old policy still limiting and the key in the log, and a
// fixed file and a SIGHUP reload again.
func TestReloadUnderFlood(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, lenientYAML)
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--config", cfg, "--pin-path", pin)
	f := startFlood(t, p, 60*time.Second)

	prev := scrape(t, p.Coll)
	reloads := func() float64 { return sum(scrape(t, p.Coll), "tierlimit_config_reloads_total", "result=success") }
	waitReloads := func(want float64, key string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if got := sum(scrape(t, p.Coll), "tierlimit_config_reloads_total", key); got >= want {
				if got > want {
					t.Fatalf("%s reloads: %v, want %v", key, got, want)
				}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s reloads did not reach %v:\n%s", key, want, a.log)
	}

	for i := 1; i <= 20; i++ {
		strict := i%2 == 1
		writeConfig(t, cfg, map[bool]string{true: strictYAML, false: lenientYAML}[strict])
		waitReloads(float64(i), "result=success")
		time.Sleep(200 * time.Millisecond) // one window
		perWindow, share := passRate(t, p.Coll, &prev)
		checkFollows(t, fmt.Sprintf("reload %d", i), strict, perWindow, share)
	}
	if got := reloads(); got != 20 {
		t.Fatalf("config_reloads_total{result=success} = %v, want 20", got)
	}

	// A bad file is refused: the old (lenient) policy keeps running.
	writeConfig(t, cfg, "window: 200ms\nmax: 100\ntiers:\n  - {at: 80%, drop: 20%}\n  - {at: 70%, drop: 50%}\n")
	waitReloads(1, "result=error")
	if !a.waitLog("tiers[1].at", 2*time.Second) {
		t.Fatalf("the log does not name the bad key:\n%s", a.log)
	}
	perWindow, share := passRate(t, p.Coll, &prev)
	checkFollows(t, "after a bad reload, the old lenient policy", false, perWindow, share)
	writeConfig(t, cfg, strictYAML)
	waitReloads(21, "result=success")
	a.signal(t, syscall.SIGHUP)
	waitReloads(22, "result=success")
	perWindow, share = passRate(t, p.Coll, &prev)
	checkFollows(t, "after fixing the file", true, perWindow, share)
	f.stop()
	if f.err != nil {
		t.Fatal(f.err)
	}
}

// xdpWatch polls the collector veth's XDP attachment every millisecond and
// records the program ids it saw and how many polls found none.
type xdpWatch struct {
	mu      sync.Mutex
	ids     map[uint32]bool
	without int
	polls   int
	stop    chan struct{}
	done    chan struct{}
}

func watchXDP(t *testing.T, p *testenv.Pair) *xdpWatch {
	t.Helper()
	var h *netlink.Handle
	err := p.Coll.Do(func() error {
		nsh, err := netns.Get()
		if err != nil {
			return err
		}
		defer nsh.Close()
		h, err = netlink.NewHandleAt(nsh)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &xdpWatch{ids: map[uint32]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer h.Close()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(time.Millisecond):
			}
			l, err := h.LinkByName(p.CollIf)
			w.mu.Lock()
			w.polls++
			if err != nil || l.Attrs().Xdp == nil || !l.Attrs().Xdp.Attached {
				w.without++
			} else {
				w.ids[l.Attrs().Xdp.ProgId] = true
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.close)
	return w
}

func (w *xdpWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// TestKillDashNineUnderFlood kills the agent with SIGKILL under a flood:
// limiting goes on while it is down, a restarted agent adopts the pinned
// state with no moment without XDP, and the counters neither reset nor
// double: pass + drop equals what was sent, pass equals what arrived.
func TestKillDashNineUnderFlood(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, strictYAML)
	recv := testenv.NewReceiver(t, p.Coll, netip.AddrPortFrom(p.CollAddr, 514))
	args := []string{"--iface", p.CollIf, "--config", cfg, "--pin-path", pin}
	first := startRun(t, p.Coll, args...)
	watch := watchXDP(t, p)
	f := startFlood(t, p, 30*time.Second)

	// received per window while the agent is down, from the receiver.
	rateDown := func() float64 {
		_, a := recv.Counts()
		time.Sleep(600 * time.Millisecond)
		_, b := recv.Counts()
		return float64(b-a) / 3
	}
	time.Sleep(time.Second)
	first.stop(t, syscall.SIGKILL)
	if r := rateDown(); r > 300 {
		t.Fatalf("agent down: %.0f received per window, want the strict policy's ~87", r)
	}
	second := startRun(t, p.Coll, args...)
	if !second.waitLog("adopted pinned link", time.Second) {
		t.Fatalf("restarted agent did not adopt the pinned link:\n%s", second.log)
	}
	time.Sleep(time.Second)
	f.stop()
	if f.err != nil {
		t.Fatal(f.err)
	}
	recv.WaitQuiet(300*time.Millisecond, 5*time.Second)
	watch.close()

	m := scrape(t, p.Coll)
	pass := sum(m, "tierlimit_selected_packets_total", "verdict=pass")
	drop := sum(m, "tierlimit_selected_packets_total", "verdict=drop")
	_, received := recv.Counts()
	if int(pass+drop) != f.sent {
		t.Errorf("pass %v + drop %v = %v, want the %d sent: counters reset or doubled", pass, drop, pass+drop, f.sent)
	}
	if int(pass) != received {
		t.Errorf("pass %v, but the receiver got %d", pass, received)
	}
	watch.mu.Lock()
	defer watch.mu.Unlock()
	if watch.without > 0 {
		t.Errorf("%d of %d polls found the interface without XDP", watch.without, watch.polls)
	}
	if len(watch.ids) < 2 {
		t.Errorf("program ids seen %v: the restart should replace the program in place", watch.ids)
	}
	t.Logf("sent %d, passed %v, dropped %v; %d polls, program ids %v", f.sent, pass, drop, watch.polls, watch.ids)
}

// TestPingSurvivesReloadAndRestart: `ping -i 0.01` across the veth loses
// nothing while the agent reloads three times, restarts with SIGTERM and
// restarts after SIGKILL.
func TestPingSurvivesReloadAndRestart(t *testing.T) {
	testenv.Require(t)
	p, pin, cfg := pinnedSetup(t, strictYAML)
	args := []string{"--iface", p.CollIf, "--config", cfg, "--pin-path", pin}
	a := startRun(t, p.Coll, args...)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	ping := p.Send.Command(ctx, "ping", "-n", "-q", "-c", "400", "-i", "0.01", p.CollAddr.String())
	ping.Stdout, ping.Stderr = &out, &out
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	for range 3 {
		a.signal(t, syscall.SIGHUP)
		time.Sleep(200 * time.Millisecond)
	}
	a.stop(t, syscall.SIGTERM)
	a = startRun(t, p.Coll, args...)
	time.Sleep(300 * time.Millisecond)
	a.stop(t, syscall.SIGKILL)
	a = startRun(t, p.Coll, args...)
	if err := ping.Wait(); err != nil {
		t.Fatalf("ping: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), " 0% packet loss") {
		t.Fatalf("ping lost packets:\n%s", out.String())
	}
	if n := strings.Count(a.log.String(), "msg=reloaded"); n != 0 {
		t.Logf("last agent reloaded %d times", n)
	}
}
