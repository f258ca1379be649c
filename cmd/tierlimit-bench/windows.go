package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// runTrafgenConfig is `tierlimit-bench trafgen-config`: it prints the
// trafgen configuration of the flood's syslog frame for given addresses,
// for the Vagrant sender (deploy/vagrant/e2e.sh).
func runTrafgenConfig(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("trafgen-config", flag.ContinueOnError)
	srcMAC := fs.String("src-mac", "", "sender's `MAC`")
	dstMAC := fs.String("dst-mac", "", "collector's (or the next hop's) `MAC`")
	src := fs.String("src", "", "sender's IPv4 `address`")
	dst := fs.String("dst", "", "collector's IPv4 `address`")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	sm, err1 := net.ParseMAC(*srcMAC)
	dm, err2 := net.ParseMAC(*dstMAC)
	sa, da := net.ParseIP(*src).To4(), net.ParseIP(*dst).To4()
	if err := errors.Join(err1, err2); err != nil || sa == nil || da == nil {
		return usageError{fmt.Errorf("need -src-mac, -dst-mac, -src and -dst (IPv4): %v", err)}
	}
	f, err := frame(sm, dm, sa, da)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, trafgenConfig(f))
	return err
}

// runWindows is `tierlimit-bench windows`: it follows a running agent's
// metrics (DESIGN.md §5) and prints one line per window: the offered load
// (last_window_packets), the packets passed and dropped in it by tier, and
// what tiers.Expected predicts for that load under -max (the policy's).
// Counters are read every -interval, so a window's pass/drop split is
// attributed at that resolution.
func runWindows(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("windows", flag.ContinueOnError)
	url := fs.String("metrics", "http://127.0.0.1:9713/metrics", "the agent's metrics `URL`")
	max := fs.Uint64("max", 40000, "the policy's max, for the model column")
	window := fs.Duration("window", time.Second, "the policy's window, for the model column")
	interval := fs.Duration("interval", 50*time.Millisecond, "scrape interval")
	dur := fs.Duration("duration", 30*time.Second, "stop after")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	tab, err := tiers.Compile(benchPolicy(*max, *window), 0)
	if err != nil {
		return usageError{err}
	}
	ctx, cancel := context.WithTimeout(ctx, *dur)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	fmt.Fprintf(stdout, "%-6s %10s %10s %10s %10s  %s\n", "window", "offered", "passed", "dropped", "model", "by tier (pass/drop)")
	var prev, start map[string]float64
	n := 0
	for {
		cur, err := scrape(ctx, client, *url)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if prev != nil && cur["tierlimit_window_packets"] < prev["tierlimit_window_packets"] && start != nil {
			// A window opened: the previous one is final.
			offered := cur["tierlimit_last_window_packets"]
			pass, drop, byTier := deltas(start, cur)
			n++
			fmt.Fprintf(stdout, "%-6d %10.0f %10.0f %10.0f %10.1f  %s\n", n, offered, pass, drop, tab.Expected(uint64(offered)).Passed, byTier)
			start = cur
		}
		if start == nil && cur["tierlimit_window_packets"] > 0 {
			start = cur
		}
		prev = cur
		if err := sleepCtx(ctx, *interval); err != nil {
			return nil
		}
	}
}

// deltas sums selected_packets_total between two scrapes by verdict, and
// lists them by tier.
func deltas(a, b map[string]float64) (pass, drop float64, byTier string) {
	var parts []string
	for t := 0; t <= 16; t++ {
		p := b[fmt.Sprintf(`tierlimit_selected_packets_total{tier="%d",verdict="pass"}`, t)] - a[fmt.Sprintf(`tierlimit_selected_packets_total{tier="%d",verdict="pass"}`, t)]
		d := b[fmt.Sprintf(`tierlimit_selected_packets_total{tier="%d",verdict="drop"}`, t)] - a[fmt.Sprintf(`tierlimit_selected_packets_total{tier="%d",verdict="drop"}`, t)]
		pass += p
		drop += d
		if p+d > 0 {
			parts = append(parts, fmt.Sprintf("t%d %.0f/%.0f", t, p, d))
		}
	}
	return pass, drop, strings.Join(parts, " ")
}

// scrape reads a Prometheus text exposition into "name{labels}" -> value,
// with the labels in the order they came (tier before verdict, as the
// agent writes them).
func scrape(ctx context.Context, c *http.Client, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		m[l[:i]] = v
	}
	return m, sc.Err()
}
