package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// windowState is what `window-check` keeps between calls (-state): the
// cumulative counts after the previous window.
type windowState struct {
	Window int     `json:"window"`
	Lines  int     `json:"lines"`
	Pass   float64 `json:"pass"`
	Drop   float64 `json:"drop"`
	Failed int     `json:"failed"`
	// Metrics is the scrape after the window, for the per-tier deltas.
	Metrics map[string]float64 `json:"metrics"`
}

// windowCheck is the configuration of `tierlimit-bench window-check`.
type windowCheck struct {
	metrics, log, state string
	tab                 tiers.Table
	max                 uint64
	sent                uint64
	settle, timeout     time.Duration
	sigmas              float64
}

// runWindowCheck is `tierlimit-bench window-check`, the collector's side of
// make vagrant-e2e (deploy/vagrant/e2e.sh): after one burst of the flood, a
// burst that fits in one policy window, it waits for the counts to settle,
// then checks that window:
//
//   - the offered load is the packets judged since the previous check (the
//     metrics' pass and drop deltas), and it was above max;
//   - the burst was one window: each tier judged exactly the packets that
//     n = 1..offered puts in it (two windows would fill the low tiers twice);
//   - the passed count (rsyslog's lines in -log, one per datagram) is within
//     -sigmas standard deviations of tiers.Expected for that offered load;
//   - the metrics' pass delta equals rsyslog's lines (nothing lost between
//     XDP_PASS and the collector).
//
// It prints one table row and exits 1 when a check fails. -init records the
// baseline (and prints the header); -total checks the whole run instead:
// metrics pass == rsyslog lines since -init.
func runWindowCheck(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("window-check", flag.ContinueOnError)
	c := windowCheck{}
	fs.StringVar(&c.metrics, "metrics", "http://127.0.0.1:9713/metrics", "the agent's metrics `URL`")
	fs.StringVar(&c.log, "log", "/var/log/tierlimit-e2e.log", "rsyslog's output `file`, one line per datagram")
	fs.StringVar(&c.state, "state", "/run/tierlimit-e2e.state", "state `file` between calls")
	fs.Uint64Var(&c.max, "max", 1000, "the policy's max (default tiers)")
	window := fs.Duration("window", 2*time.Second, "the policy's window")
	fs.Uint64Var(&c.sent, "sent", 0, "datagrams the sender sent in the burst (shown, not checked)")
	fs.DurationVar(&c.settle, "settle", 1500*time.Millisecond, "counts unchanged this long are final")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "give up settling after")
	fs.Float64Var(&c.sigmas, "sigmas", 5, "allowed distance from the model, in standard deviations")
	initial := fs.Bool("init", false, "record the baseline and print the header")
	total := fs.Bool("total", false, "check the run's totals: metrics pass == rsyslog lines")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	tab, err := tiers.Compile(benchPolicy(c.max, *window), 0)
	if err != nil {
		return usageError{err}
	}
	c.tab = tab
	lines, m, err := c.settled(ctx)
	if err != nil {
		return err
	}
	pass, drop := sumVerdicts(m)
	switch {
	case *initial:
		fmt.Fprintf(stdout, "%-6s %8s %8s %8s %8s %8s %9s %8s  %-4s %s\n", "window", "sent", "offered",
			"rsyslog", "pass", "drop", "model", "5σ", "ok", "by tier (pass/drop)")
		return c.save(windowState{Lines: lines, Pass: pass, Drop: drop, Metrics: m})
	case *total:
		return c.checkTotal(lines, pass, stdout)
	}
	return c.checkWindow(lines, m, stdout)
}

// checkWindow checks the window that the last burst made; see runWindowCheck.
func (c windowCheck) checkWindow(lines int, m map[string]float64, stdout io.Writer) error {
	prev, err := c.load()
	if err != nil {
		return err
	}
	pass, drop := sumVerdicts(m)
	dPass, dDrop, byTier := deltas(prev.Metrics, m)
	dLines := lines - prev.Lines
	// The burst's packets are all the packets judged since the last check.
	offered := uint64(dPass + dDrop)
	e := c.tab.Expected(offered)
	bound := c.sigmas * math.Sqrt(e.Variance)
	var errs []error
	if offered <= c.max {
		errs = append(errs, fmt.Errorf("offered %d is not above max %d: the sender was too slow or frames were lost before XDP", offered, c.max))
	}
	// One window: each tier got exactly the packets that n = 1..offered
	// puts in it. Two windows would put more in the low tiers.
	for k, te := range e.PerTier {
		if got := tierPackets(prev.Metrics, m, k); got != float64(te.Packets) {
			errs = append(errs, fmt.Errorf("tier %d judged %.0f packets, one window of %d puts %d in it: "+
				"the burst spanned two windows (make the window longer or the burst smaller)", k, got, offered, te.Packets))
			break
		}
	}
	if math.Abs(float64(dLines)-e.Passed) > bound {
		errs = append(errs, fmt.Errorf("rsyslog got %d lines, the model expects %.1f ± %.1f (%.0fσ)", dLines, e.Passed, bound, c.sigmas))
	}
	if float64(dLines) != dPass {
		errs = append(errs, fmt.Errorf("metrics passed %.0f but rsyslog got %d lines", dPass, dLines))
	}
	ok := "ok"
	if len(errs) > 0 {
		ok = "FAIL"
	}
	cur := windowState{Window: prev.Window + 1, Lines: lines, Pass: pass, Drop: drop, Failed: prev.Failed, Metrics: m}
	if len(errs) > 0 {
		cur.Failed++
	}
	fmt.Fprintf(stdout, "%-6d %8d %8d %8d %8.0f %8.0f %9.1f %8.1f  %-4s %s\n", cur.Window, c.sent, offered,
		dLines, dPass, dDrop, e.Passed, bound, ok, byTier)
	if err := c.save(cur); err != nil {
		return err
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("window %d: %w", cur.Window, err)
	}
	return nil
}

// checkTotal compares the run's totals since -init.
func (c windowCheck) checkTotal(lines int, pass float64, stdout io.Writer) error {
	prev, err := c.load()
	if err != nil {
		return err
	}
	first, err := c.loadInit()
	if err != nil {
		return err
	}
	dLines, dPass := lines-first.Lines, pass-first.Pass
	fmt.Fprintf(stdout, "total: %d windows checked, %d failed; metrics passed %.0f, rsyslog got %d lines\n",
		prev.Window, prev.Failed, dPass, dLines)
	switch {
	case prev.Window == 0:
		return errors.New("no window was checked")
	case prev.Failed > 0:
		return fmt.Errorf("%d of %d windows failed", prev.Failed, prev.Window)
	case float64(dLines) != dPass:
		return fmt.Errorf("metrics passed %.0f in all but rsyslog got %d lines", dPass, dLines)
	}
	return nil
}

// settled polls rsyslog's line count and the metrics until neither has
// changed for c.settle, and returns both.
func (c windowCheck) settled(ctx context.Context) (int, map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second}
	lastLines, lastPass, lastDrop := -1, -1.0, -1.0
	since := time.Now()
	for {
		lines, err := countLines(c.log)
		if err != nil {
			return 0, nil, err
		}
		m, err := scrape(ctx, client, c.metrics)
		if err != nil {
			return 0, nil, fmt.Errorf("scrape %s: %w", c.metrics, err)
		}
		pass, drop := sumVerdicts(m)
		if lines != lastLines || pass != lastPass || drop != lastDrop {
			lastLines, lastPass, lastDrop, since = lines, pass, drop, time.Now()
		} else if time.Since(since) >= c.settle {
			return lines, m, nil
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return 0, nil, fmt.Errorf("counts did not settle within %s (rsyslog %d lines, pass %.0f)", c.timeout, lines, pass)
		}
	}
}

// tierPackets is tier k's selected packets (pass and drop) between two scrapes.
func tierPackets(a, b map[string]float64, k int) float64 {
	var n float64
	for _, v := range []string{"pass", "drop"} {
		key := fmt.Sprintf(`tierlimit_selected_packets_total{tier="%d",verdict="%s"}`, k, v)
		n += b[key] - a[key]
	}
	return n
}

// sumVerdicts sums selected_packets_total over tiers by verdict.
func sumVerdicts(m map[string]float64) (pass, drop float64) {
	pass, drop, _ = deltas(map[string]float64{}, m)
	return pass, drop
}

func countLines(path string) (int, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return bytes.Count(b, []byte{'\n'}), nil
}

func (c windowCheck) save(s windowState) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if s.Window == 0 {
		if err := os.WriteFile(c.state+".init", b, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(c.state, b, 0o644)
}

func (c windowCheck) load() (windowState, error) { return readState(c.state) }

func (c windowCheck) loadInit() (windowState, error) { return readState(c.state + ".init") }

func readState(path string) (windowState, error) {
	var s windowState
	b, err := os.ReadFile(path)
	if err != nil {
		return s, fmt.Errorf("window-check: %w (run window-check -init first)", err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("window-check: state %s: %w", path, err)
	}
	return s, nil
}
