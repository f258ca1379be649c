package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers/storeurl"
	"golang.org/x/sys/unix"
)

// TestFleetPerfStore measures the store's load for a fleet of 1,000
// members at report 100 ms against the real redis-server over 10 s: round
// trips per second (the server's own count of EVALSHA calls), the
// server's CPU (/proc/PID/stat) and each round trip's latency as the
// clients saw it. The members are the controller's own report round trip
// (the same script, keys and arguments), 1,000 member names driven by 20
// clients of 50 members each: 1,000 controllers in one test process on a
// small machine would measure the test's scheduler, not the store (each
// wakes 10 times a second). Set TIERLIMIT_FLEET_PERF=1 to run it.
func TestFleetPerfStore(t *testing.T) {
	if os.Getenv("TIERLIMIT_FLEET_PERF") != "1" {
		t.Skip("a measurement: set TIERLIMIT_FLEET_PERF=1 to run it")
	}
	const (
		members = 1000
		clients = 20
		every   = 100 * time.Millisecond
		ttl     = 3 * time.Second
		period  = 10 * time.Second
	)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	su, err := parseStore(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	var errs, lastCount int
	measuring := false
	for w := range clients {
		c, err := dialRedis(&connOptions{su: su, dials: new(atomic.Uint64), log: slog.New(slog.DiscardHandler),
			creds:  func(context.Context) (string, string, error) { return "", "", nil },
			report: func() time.Duration { return every }, ttl: func() time.Duration { return ttl }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := time.NewTicker(every)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
				}
				for m := w; m < members; m += clients {
					start := time.Now()
					// A report's own deadline is ttl (inflight.go); the
					// controller waits at most every for it.
					ctx, cancel := context.WithTimeout(context.Background(), ttl)
					v, err := c.report(ctx, "perf1k", fmt.Sprintf("m%04d", m), Sums{In: uint64(m) / 2, Total: uint64(m)}, ttl)
					cancel()
					d := time.Since(start)
					mu.Lock()
					if measuring {
						lat = append(lat, d)
						if err != nil {
							errs++
						}
					}
					lastCount = v.members
					mu.Unlock()
				}
			}
		}()
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
	time.Sleep(2 * time.Second)
	cpu0, err := testenv.ProcCPU(r.PID(0))
	if err != nil {
		t.Fatal(err)
	}
	calls0 := evalCalls(t, r)
	w0 := time.Now()
	mu.Lock()
	measuring = true
	mu.Unlock()
	time.Sleep(period)
	mu.Lock()
	measuring = false
	got := append([]time.Duration(nil), lat...)
	nerr, count := errs, lastCount
	mu.Unlock()
	cpu1, _ := testenv.ProcCPU(r.PID(0))
	calls1 := evalCalls(t, r)
	wall := time.Since(w0)
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	slow := len(got) - sort.Search(len(got), func(i int) bool { return got[i] > every })
	q := func(p float64) time.Duration { return got[int(p*float64(len(got)-1))] }
	rate := float64(calls1-calls0) / wall.Seconds()
	t.Logf("%d members at %v (%d clients): %.0f round trips/s (server's EVALSHA count; ideal %d/s), redis-server CPU %.1f %% of one CPU (%.1f µs per round trip); latency p50 %v p99 %v max %v; slow %d, errors %d of %d; members counted %d",
		members, every, clients, rate, int(members*time.Second/every), 100*float64(cpu1-cpu0)/float64(wall),
		float64((cpu1-cpu0).Microseconds())/float64(calls1-calls0), q(0.5), q(0.99), got[len(got)-1], slow, nerr, len(got), count)
	if count != members {
		t.Errorf("the last report counted %d members; want %d", count, members)
	}
}

// evalCalls returns the server's count of EVALSHA calls.
func evalCalls(t *testing.T, r *testenv.Redis) int64 {
	for _, line := range strings.Split(r.CLI(t, 0, "info", "commandstats"), "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			v, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			return v
		}
	}
	return 0
}

// benchLimiter and benchFallback stand where the program and the agent
// stand, doing nothing.
type benchLimiter struct{}

func (benchLimiter) FleetEstimate() (uint64, uint64, error) { return 500, 1000, nil }
func (benchLimiter) SetFleetOthers(in, total uint64) error  { return nil }

type benchFallback struct{}

func (benchFallback) EnterFallback(int) error { return nil }
func (benchFallback) LeaveFallback() error    { return nil }

// BenchmarkFleetReport is one report of the loop against a real
// redis-server: the process's CPU per report (cpu-µs/op, getrusage: the
// client's side only) of the loop's path (reportWithin: the report on its
// own goroutine, bounded by ttl, waited for at most report) beside the
// same round trip made inline with a deadline of report (the loop before
// issue 40), in the same run: compare the two cpu-µs/op.
func BenchmarkFleetReport(b *testing.B) {
	r := testenv.StartRedis(b, testenv.RedisOptions{})
	cfg := Config{Name: "bench", Member: "m", Store: r.URL(), Max: 1000, Report: 100 * time.Millisecond, TTL: time.Second}
	c, err := Start(cfg, benchLimiter{}, benchFallback{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	c.Halt() // the loop stops; the benchmark drives the reports
	c.st, err = dial(&connOptions{su: mustParse(b, cfg.Store), cfg: cfg, dials: &c.cm.dials, log: c.log, creds: c.credentials,
		report: func() time.Duration { return cfg.Report }, ttl: func() time.Duration { return cfg.TTL }})
	if err != nil {
		b.Fatal(err)
	}
	est := Sums{In: 500, Total: 1000}
	run := func(b *testing.B, one func() error) {
		for range 10 {
			one()
		}
		var ru0, ru1 unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &ru0)
		b.ResetTimer()
		for range b.N {
			if err := one(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		unix.Getrusage(unix.RUSAGE_SELF, &ru1)
		cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	}
	b.Run("inline", func(b *testing.B) {
		run(b, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), cfg.Report)
			_, err := c.st.report(ctx, cfg.Name, cfg.Member, est, cfg.TTL)
			cancel()
			return err
		})
	})
	b.Run("inflight", func(b *testing.B) {
		run(b, func() error {
			_, err := c.reportWithin(&cfg, est, cfg.Report)
			return err
		})
	})
}

func mustParse(tb testing.TB, s string) storeurl.URL {
	u, err := parseStore(s)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}
