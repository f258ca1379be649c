package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// suiteOpts are the suite's flags.
type suiteOpts struct {
	out, bpfTest, benchtime, command string
	benchFrom, peers                 string
	sources                          []string
	runs, count                      int
	quick, floods                    bool
	xdpTxPackets                     uint64
	flood                            *floodConfig
}

// runSuite is `tierlimit-bench suite`: figures 1-3 from the bpf package's
// benchmarks (a test binary built by go test -c), figure 4 from floods, the
// sweep and its plot, all written to -out as results.md, the PNG and the
// raw data.
func runSuite(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, methods, err := parseSuiteFlags(args)
	if err != nil {
		return err
	}
	cfg := o.flood
	if err := cfg.init(stderr); err != nil {
		return err
	}
	ms, err := parseMethods(methods)
	if err != nil {
		return usageError{err}
	}
	raw := filepath.Join(o.out, "raw")
	if err := os.MkdirAll(raw, 0o755); err != nil {
		return err
	}
	start := time.Now()
	rep := &report{opts: o, env: environment(), start: start, peersFrom: o.peers}
	if o.peers != "" {
		rep.peerSources = readPeerSources(o.peers)
	}

	if o.benchFrom != "" {
		out, err := os.ReadFile(o.benchFrom)
		if err != nil {
			return err
		}
		if rep.bench = parseBench(out); len(rep.bench) == 0 {
			return fmt.Errorf("%s holds no benchmark results", o.benchFrom)
		}
		rep.profileLine = profileReason(out)
		rep.sampleLines = sampledLines(out)
	} else if o.bpfTest != "" {
		if err := rep.runBPFFigures(ctx, raw, stderr); err != nil {
			return err
		}
	}

	if !o.floods {
		old, err := os.ReadFile(filepath.Join(o.out, "results.md"))
		if err != nil {
			return fmt.Errorf("-floods=false carries figures 4 and 5 over from the last results.md: %w", err)
		}
		rep.carried = carriedFloods(string(old))
		return writeReport(rep, o, start, stdout)
	}
	for _, src := range o.sources {
		c := *cfg
		c.source = src
		if src == "xdp-tx" {
			c.packets, c.rate = o.xdpTxPackets, 0
		}
		fmt.Fprintf(stderr, "figure 4 (%s): %d runs x %v\n", src, o.runs, ms)
		res, err := floodRuns(ctx, &c, ms, o.runs, stderr)
		if err != nil {
			return err
		}
		rep.floods = append(rep.floods, floodSet{source: src, cfg: c, methods: ms, runs: res})
	}

	if err := rep.runSweep(ctx, cfg, stderr); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(raw, "flood.json"), rep.floods); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(raw, "sweep.json"), rep.sweep); err != nil {
		return err
	}
	return writeReport(rep, o, start, stdout)
}

// parseSuiteFlags parses the suite's flags (with the flood's, floodFlags)
// into its options and the -methods list, not yet parsed.
func parseSuiteFlags(args []string) (suiteOpts, string, error) {
	fs := flag.NewFlagSet("suite", flag.ContinueOnError)
	o := suiteOpts{}
	cfg, runs, methods := floodFlags(fs)
	o.flood = cfg
	fs.StringVar(&o.out, "out", "deploy/bench", "output `dir` for results.md, the plot and raw/")
	fs.StringVar(&o.bpfTest, "bpf-test", "", "the bpf package's test binary (go test -c ./bpf); empty skips figures 1-3")
	fs.StringVar(&o.benchtime, "benchtime", "4194304x", "-test.benchtime of figures 1-3 (packets per measurement, b.N; every program runs at least two chunks sized to the host's tick, more when b.N is more)")
	fs.IntVar(&o.count, "count", 3, "-test.count of figures 1-3")
	fs.StringVar(&o.peers, "peers", "", "`dir` of the peers' objects (deploy/bench/peers.sh) for section 6; empty leaves them out, and the page says so")
	fs.Uint64Var(&o.xdpTxPackets, "xdp-tx-packets", 3_000_000, "frames per run of the xdp-tx flood")
	sources := fs.String("sources", "trafgen", "flood sources of figure 4, comma-separated: trafgen, xdp-tx (exploratory: see results.md)")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: 1 run each, short floods, 3 sweep points (CI; no timing claims)")
	fs.StringVar(&o.command, "command", "", "the command line to quote in results.md (default: this one)")
	fs.StringVar(&o.benchFrom, "bench-from", "", "take figures 1-3 from this `file` of go test -bench output (a raw/bpf-bench.txt) instead of running -bpf-test")
	fs.BoolVar(&o.floods, "floods", true, "run figures 4 and 5; false carries them over, marked as such, from the results.md already in -out")
	if err := fs.Parse(args); err != nil {
		return suiteOpts{}, "", usageError{err}
	}
	o.runs = *runs
	o.sources = strings.Split(*sources, ",")
	if o.peers != "" {
		// The bpf test binary runs in bpf/.
		abs, err := filepath.Abs(o.peers)
		if err != nil {
			return suiteOpts{}, "", usageError{fmt.Errorf("-peers %s: %w", o.peers, err)}
		}
		o.peers = abs
	}
	if o.quick {
		o.runs, o.count, o.benchtime = 1, 1, "262144x"
		cfg.packets, o.xdpTxPackets = 60_000, 300_000
	}
	if o.command == "" {
		o.command = "tierlimit-bench suite " + strings.Join(args, " ")
	}
	return o, *methods, nil
}

// writeReport writes results.md.
func writeReport(rep *report, o suiteOpts, start time.Time, stdout io.Writer) error {
	rep.elapsed = time.Since(start)
	var md bytes.Buffer
	rep.write(&md)
	path := filepath.Join(o.out, "results.md")
	if err := os.WriteFile(path, md.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s in %v\n", path, rep.elapsed.Round(time.Second))
	return nil
}

// runBPFFigures runs figures 1-3, the bpf benchmarks, and keeps their raw
// output in raw/.
func (rep *report) runBPFFigures(ctx context.Context, raw string, stderr io.Writer) error {
	fmt.Fprintln(stderr, "figures 1-3: bpf benchmarks")
	out, err := runBPFBench(ctx, rep.opts, stderr)
	if werr := os.WriteFile(filepath.Join(raw, "bpf-bench.txt"), out, 0o644); werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	rep.bench = parseBench(out)
	rep.profileLine = profileReason(out)
	rep.sampleLines = sampledLines(out)
	if len(rep.bench) == 0 {
		return errors.New("the bpf benchmarks printed no results")
	}
	return nil
}

// runSweep measures offered vs passed at each sweep load for each limiter
// and plots it.
func (rep *report) runSweep(ctx context.Context, cfg *floodConfig, stderr io.Writer) error {
	loads := sweepLoads
	if rep.opts.quick {
		loads = sweepLoadsQuick
	}
	fmt.Fprintf(stderr, "plot: sweep of %d loads\n", len(loads))
	for _, m := range []method{methodXDP, methodApp, methodNFT} {
		pts, err := sweep(ctx, cfg, m, loads)
		if err != nil {
			return err
		}
		rep.sweep = append(rep.sweep, pts...)
	}
	rep.plot = "offered-vs-passed.png"
	if err := plotSweep(filepath.Join(rep.opts.out, rep.plot), cfg, rep.sweep); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// carriedFloods returns sections 4 and 5 of an earlier results.md, and the
// line that says when that file was written.
func carriedFloods(md string) string {
	var b strings.Builder
	var when string
	in := false
	for line := range strings.Lines(md) {
		switch {
		case strings.HasPrefix(line, "Written by "):
			when = strings.TrimSpace(line)
		case strings.HasPrefix(line, "## 4. ") || strings.HasPrefix(line, "## 5. "):
			in = true
		case strings.HasPrefix(line, "## "):
			in = false
		}
		if in {
			b.WriteString(line)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return fmt.Sprintf("> **Figures 4 and 5 are carried over, not rerun** (this run was `-floods=false`): they are the previous results.md's, whose header read: %s Their references to figure 2 quote that run's figure 2.\n\n%s", when, b.String())
}

// benchPattern is the -test.bench of figures 1-3: every benchmark that the
// report reads, with all their sub-benchmarks.
const benchPattern = "^(BenchmarkTiming|BenchmarkPeers|BenchmarkProgram|BenchmarkBarePass|BenchmarkLiveFrames|BenchmarkLiveFramesSources|BenchmarkScaling|BenchmarkStages|BenchmarkRecord|BenchmarkLiveFramesRecord|BenchmarkRecordTransport)$"

func runBPFBench(ctx context.Context, o suiteOpts, stderr io.Writer) ([]byte, error) {
	cmd := exec.CommandContext(ctx, o.bpfTest, "-test.run", "^$",
		"-test.bench", benchPattern,
		"-test.benchtime", o.benchtime, "-test.count", strconv.Itoa(o.count))
	// Run from the package directory, as go test does.
	cmd.Dir = "bpf"
	if _, err := os.Stat(cmd.Dir); err != nil {
		cmd.Dir = ""
	}
	cmd.Env = append(os.Environ(), "TIERLIMIT_REQUIRE_BPF=1", "TIERLIMIT_PEERS_DIR="+o.peers)
	if o.quick {
		// CI's smoke run: chunks of a few ticks (bpf/bench_chunks_test.go).
		cmd.Env = append(cmd.Env, "TIERLIMIT_BENCH_TICKS=5")
	}
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, stderr)
	cmd.Stderr = stderr
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s: %w", o.bpfTest, err)
	}
	return out.Bytes(), nil
}

// benchResult is one line of go test -bench output: the benchmark's name
// without the GOMAXPROCS suffix, and its metrics by unit.
type benchResult struct {
	name    string
	metrics map[string]float64
}

func parseBench(out []byte) []benchResult {
	var res []benchResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		r := benchResult{name: name, metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			r.metrics[f[i+1]] = v
		}
		res = append(res, r)
	}
	return res
}

// values are the metric unit of every run of benchmark name.
func values(rs []benchResult, name, unit string) []float64 {
	var v []float64
	for _, r := range rs {
		if x, ok := r.metrics[unit]; ok && r.name == name {
			v = append(v, x)
		}
	}
	return v
}

// stat is a median with its min and max.
type stat struct {
	med, lo, hi float64
	n           int
}

func statOf(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{med: med, lo: s[0], hi: s[len(s)-1], n: len(s)}
}

// f formats a stat with the given precision: "med [min, max]".
func (s stat) f(prec int) string {
	if s.n == 0 {
		return "n/a"
	}
	if s.n == 1 {
		return strconv.FormatFloat(s.med, 'f', prec, 64)
	}
	return fmt.Sprintf("%.*f [%.*f, %.*f]", prec, s.med, prec, s.lo, prec, s.hi)
}

type env struct {
	cpu, kernel, goVersion, trafgen, nft, commit, date string
	cpus                                               int
}

func environment() env {
	e := env{goVersion: runtime.Version(), cpus: runtime.NumCPU(), date: time.Now().UTC().Format("2006-01-02 15:04 MST")}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		e.kernel = unix.ByteSliceToString(u.Release[:])
	}
	e.trafgen = firstLine("trafgen", "-v")
	if b, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "netsniff-ng").Output(); err == nil {
		e.trafgen = "netsniff-ng " + string(b)
	}
	e.nft = firstLine("nft", "--version")
	e.commit = firstLine("git", "rev-parse", "--short", "HEAD")
	if firstLine("git", "status", "--porcelain", "--untracked-files=no") != "" {
		e.commit += " (with uncommitted changes)"
	}
	return e
}

func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return ""
	}
	l, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(l)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
