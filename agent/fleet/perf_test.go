package fleet_test

import (
	"bufio"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"golang.org/x/sys/unix"
)

// perfEnv gates the measurements: they take half a minute and load the
// machine, so only make bench (or a person) runs them.
const perfEnv = "TIERLIMIT_FLEET_PERF"

func requirePerf(t *testing.T) {
	if os.Getenv(perfEnv) != "1" {
		t.Skipf("a measurement: set %s=1 to run it", perfEnv)
	}
}

// selfUsage returns the process's CPU time (user + system) and its
// context switches (voluntary + involuntary).
func selfUsage(t *testing.T) (time.Duration, int64) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw + ru.Nivcsw
}

func serverCPU(t *testing.T, r *testenv.Redis) time.Duration {
	d, err := testenv.ProcCPU(r.PID(0))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestFleetPerfLoop measures one member's report loop at report 100 ms
// over 10 s: the CPU the process spends (getrusage, user + system), as a
// share of one CPU. The bound is 0.5 %. Beside it, in the same
// run, the baseline: a bare Go loop that sends PING on a raw connection
// at the same rate, which is what any Go process pays to wake 10 times a
// second (the runtime's scheduler and sysmon, on this machine). The test
// fails when the controller is over 0.5 % and over 1.25 × that baseline.
func TestFleetPerfLoop(t *testing.T) {
	requirePerf(t)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	const period = 10 * time.Second
	time.Sleep(time.Second)
	idle, _, _ := usageOver(t, period, nil)
	base, baseCS, _ := usageOver(t, period, pingLoop(t, r.Addrs[0]))

	m := join(t, testConfig(r.URL(), "perf", "a"), 1000)
	time.Sleep(time.Second) // past the start's allocations
	srv0 := serverCPU(t, r)
	est0, _ := m.k.calls()
	share, cs, wall := usageOver(t, period, nil)
	est1, _ := m.k.calls()
	srv1 := serverCPU(t, r)
	reports := float64(est1 - est0)
	t.Logf("report loop at %v: %.0f reports in %v, process CPU %.3f %% of one CPU (%.0f µs, %.1f context switches per report); "+
		"baseline (bare PING loop) %.3f %% (%.1f switches per tick): ratio %.2f; idle process %.3f %%; redis-server CPU %v",
		testReport, reports, wall.Round(time.Millisecond), 100*share, share*wall.Seconds()*1e6/reports, float64(cs)/reports,
		100*base, float64(baseCS)/(period.Seconds()*10), share/base, 100*idle, srv1-srv0)
	if share >= 0.005 && share > 1.25*base {
		t.Errorf("the report loop uses %.3f %% of one CPU, %.2f × the bare loop's %.3f %%; want < 0.5 %% or <= 1.25 ×", 100*share, share/base, 100*base)
	}
}

// usageOver runs loop (when not nil) in the background for period and
// returns the process's CPU share of one CPU, its context switches and the
// wall time measured.
func usageOver(t *testing.T, period time.Duration, loop func(stop <-chan struct{})) (float64, int64, time.Duration) {
	stop, done := make(chan struct{}), make(chan struct{})
	if loop != nil {
		go func() { defer close(done); loop(stop) }()
		time.Sleep(time.Second)
	} else {
		close(done)
	}
	cpu0, cs0 := selfUsage(t)
	w0 := time.Now()
	time.Sleep(period)
	cpu1, cs1 := selfUsage(t)
	wall := time.Since(w0)
	close(stop)
	<-done
	return float64(cpu1-cpu0) / float64(wall), cs1 - cs0, wall
}

// pingLoop is the baseline: PING and its reply on a raw connection every
// report, with a deadline, and nothing else.
func pingLoop(t *testing.T, addr string) func(stop <-chan struct{}) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rd := bufio.NewReader(c)
	return func(stop <-chan struct{}) {
		tk := time.NewTicker(testReport)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			c.SetDeadline(time.Now().Add(testReport))
			c.Write([]byte("PING\r\n"))
			rd.ReadString('\n')
		}
	}
}
