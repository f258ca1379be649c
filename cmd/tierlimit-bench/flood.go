package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// method is one way of shedding the flood.
type method string

const (
	methodNone method = "none"
	methodXDP  method = "tierlimit"
	methodNFT  method = "nftables"
	methodApp  method = "in-app"
	// methodXDPRecord is tierlimit with the shed record on (DESIGN.md
	// §10): samples at the default cap written to pcapng by the agent's
	// recorder. Not in the suite's default methods: `flood -methods
	// tierlimit,tierlimit-record` measures the record's cost beside
	// tierlimit without it (issue 23).
	methodXDPRecord method = "tierlimit-record"
)

var allMethods = []method{methodNone, methodXDP, methodNFT, methodApp, methodXDPRecord}

// floodConfig is what every flood run shares.
type floodConfig struct {
	// packets is the offered flood: this many copies of one syslog frame,
	// from trafgen at its full speed.
	packets uint64
	// max and window make the policy of every limiter: the default tiers
	// with this max per window.
	max    uint64
	window time.Duration
	// senderCPU is where trafgen runs (it pins its worker to CPU 0 itself);
	// collCPU runs the collector: the veth's NAPI thread and the receiver.
	senderCPU, collCPU int
	// source is "trafgen" or "xdp-tx" (xdpTxGen), at rate frames/s.
	source string
	rate   float64
	self   string // this executable, for the receiver
	tmp    string // a directory for trafgen and nft files
	log    io.Writer
}

// benchPolicy is the default policy (tiers 70%→20%, 80%→50%, 100%→100%,
// udp 514) with max and window set, under the ordinal shape: the suite
// compares every window packet for packet with the seed's rule (the in-app
// method implements it), and the shapes pass the same P(R) per window.
func benchPolicy(max uint64, window time.Duration) tiers.Policy {
	p := tiers.Default()
	p.Shape = tiers.ShapeOrdinal
	p.Max, p.Window = max, window
	return p
}

func (c *floodConfig) policy() tiers.Policy { return benchPolicy(c.max, c.window) }

// floodResult is one run of one method.
type floodResult struct {
	Method method `json:"method"`
	Source string `json:"source"`
	// Offered counts the frames sent (sample.offered): the offered load.
	Offered uint64 `json:"offered"`
	// TxDropped is the sender veth's tx_dropped: frames refused because the
	// collector's ring was full. trafgen retries them (backpressure: it
	// slows to the receive side's pace); for xdp-tx they are lost, as a
	// NIC's rx_missed.
	TxDropped uint64 `json:"tx_dropped"`
	// Arrived counts frames the collector's NAPI took off its ring; with
	// xdp-tx, Offered - Arrived were lost to a full ring.
	Arrived  uint64        `json:"arrived"`
	Duration time.Duration `json:"duration_ns"`
	// Received, Processed and AppDropped are the receiver's (receiverStats).
	Received   uint64 `json:"received"`
	Processed  uint64 `json:"processed"`
	AppDropped uint64 `json:"app_dropped"`
	// SockDrops is UDP RcvbufErrors in the collector namespace.
	SockDrops uint64 `json:"sock_drops"`
	// XDPPassed and XDPDropped are the program's selected counters.
	XDPPassed  uint64 `json:"xdp_passed"`
	XDPDropped uint64 `json:"xdp_dropped"`
	// CPU of the receive side, ns: the collector veth's NAPI thread, the
	// receiver process (all threads), irq+softirq time on collCPU, and
	// irq+softirq time on the sender's CPU (SenderSoftirqNs), which grows
	// with the datagrams delivered: most likely the kernel freeing consumed
	// skbs on the CPU that allocated them (skb_attempt_defer_free), trafgen's.
	// The sender's own work runs in its process context, which is not
	// counted.
	NapiNs          int64 `json:"napi_ns"`
	RecvNs          int64 `json:"recv_ns"`
	SoftirqNs       int64 `json:"softirq_ns"`
	SenderSoftirqNs int64 `json:"sender_softirq_ns"`
	// Model is the passed count that tiers.Expected predicts for the offered
	// load, window by window; Windows is how many windows the flood spans.
	Model   float64 `json:"model"`
	Windows int     `json:"windows"`
	// XDPModel is the same prediction from the program's own per-window
	// counts (tierlimit only).
	XDPModel float64 `json:"xdp_model,omitempty"`
}

// RxCPU is the receive side's CPU time in seconds.
func (r floodResult) RxCPU() float64 {
	return float64(r.NapiNs+r.RecvNs+r.SoftirqNs+r.SenderSoftirqNs) / 1e9
}

// CPUPerMOffered is receive-side CPU seconds per million packets that
// reached the collector (Arrived: all of the offered with trafgen; with
// xdp-tx those the ring did not overflow with, since a frame lost there
// costs the collector nothing).
func (r floodResult) CPUPerMOffered() float64 { return r.RxCPU() / float64(r.Arrived) * 1e6 }

// Shed is the packets that reached the collector and were not processed.
func (r floodResult) Shed() uint64 { return r.Arrived - min(r.Processed, r.Arrived) }

// CPUPerMShed is receive-side CPU seconds per million shed packets.
func (r floodResult) CPUPerMShed() float64 { return r.RxCPU() / float64(r.Shed()) * 1e6 }

// Rate is messages processed per second of flood.
func (r floodResult) Rate() float64 { return float64(r.Processed) / r.Duration.Seconds() }

// ModelErr is (processed - model) / model in percent.
func (r floodResult) ModelErr() float64 { return (float64(r.Processed) - r.Model) / r.Model * 100 }

// floodOnce runs one flood of cfg.packets against method m in a fresh
// sandbox.
func floodOnce(ctx context.Context, cfg *floodConfig, m method) (floodResult, error) {
	b, err := setup(ctx, cfg, m)
	if err != nil {
		return floodResult{}, fmt.Errorf("%s: setup: %w", m, err)
	}
	defer b.close()
	r := floodResult{Method: m, Source: cfg.source}
	c0, err := b.cpu()
	if err != nil {
		return r, err
	}
	samples, t0, err := b.flood(ctx, cfg.packets)
	if err != nil {
		return r, fmt.Errorf("%s: %w", m, err)
	}
	st, err := b.settle(ctx, t0)
	if err != nil {
		return r, err
	}
	c1, err := b.cpu()
	if err != nil {
		return r, err
	}
	last, err := b.sample(t0)
	if err != nil {
		return r, err
	}
	samples = append(samples, last)
	r.SockDrops, _ = udpRcvbufErrors(b.recv.pid())

	base := samples[0]
	r.Offered = last.offered - base.offered
	r.TxDropped = last.retries - base.retries
	r.Arrived = last.arrived - base.arrived
	r.Received, r.Processed, r.AppDropped = st.Received, st.Processed, st.AppDropped
	r.NapiNs, r.RecvNs = c1.napi-c0.napi, c1.recv-c0.recv
	r.SoftirqNs, r.SenderSoftirqNs = c1.softirq-c0.softirq, c1.sndSoftirq-c0.sndSoftirq

	tab, err := tiers.Compile(cfg.policy(), 0)
	if err != nil {
		return r, err
	}
	r.Duration = timelineOf(samples, func(s sample) uint64 { return s.offered }).duration()
	r.Model, r.Windows = timelineOf(samples, func(s sample) uint64 { return s.arrived }).model(tab, cfg.window)
	if b.lim != nil {
		xs, err := b.lim.Stats()
		if err != nil {
			return r, err
		}
		r.XDPPassed = xs.SelectedTotal(tiers.VerdictPass).Packets
		r.XDPDropped = xs.SelectedTotal(tiers.VerdictDrop).Packets
		r.XDPModel = xdpModel(tab, samples)
	}
	return r, nil
}

// runFloodCmd is `tierlimit-bench flood`: the system-level comparison only,
// printed as a table.
func runFloodCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("flood", flag.ContinueOnError)
	cfg, runs, methods := floodFlags(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if err := cfg.init(stderr); err != nil {
		return err
	}
	ms, err := parseMethods(*methods)
	if err != nil {
		return usageError{err}
	}
	res, err := floodRuns(ctx, cfg, ms, *runs, stderr)
	if err != nil {
		return err
	}
	rep := &report{floods: []floodSet{{source: cfg.source, cfg: *cfg, methods: ms, runs: res}}}
	rep.fig4(func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) })
	return nil
}

func floodFlags(fs *flag.FlagSet) (*floodConfig, *int, *string) {
	cfg := &floodConfig{}
	fs.Uint64Var(&cfg.packets, "packets", 600_000, "offered flood: `frames` per run")
	fs.Uint64Var(&cfg.max, "max", 20_000, "policy max (packets per window) of every limiter")
	fs.DurationVar(&cfg.window, "window", time.Second, "policy window (nftables can only do 1s)")
	fs.StringVar(&cfg.source, "source", "trafgen", "flood source: trafgen (skbs via sendto) or xdp-tx (live-frames XDP_TX generator: xdp_frames)")
	fs.Float64Var(&cfg.rate, "rate", 300_000, "xdp-tx: frames per second (0: unpaced)")
	fs.IntVar(&cfg.collCPU, "collector-cpu", 1, "CPU of the collector (NAPI thread and receiver); trafgen takes CPU 0")
	runs := fs.Int("runs", 5, "runs of each method")
	methods := fs.String("methods", "none,tierlimit,nftables,in-app", "methods to compare")
	return cfg, runs, methods
}

func (c *floodConfig) init(log io.Writer) error {
	c.log = log
	if c.window != time.Second {
		return usageError{errors.New("-window: the nftables equivalent needs 1s")}
	}
	if c.source != "trafgen" && c.source != "xdp-tx" {
		return usageError{fmt.Errorf("-source %q: want trafgen or xdp-tx", c.source)}
	}
	if c.collCPU == 0 {
		return usageError{errors.New("-collector-cpu: trafgen pins its worker to CPU 0; use another CPU")}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	c.self = self
	c.tmp = os.TempDir()
	for _, tool := range []string{"trafgen", "nft", "nsenter", "taskset", "ethtool", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install it (deploy/vagrant/provision.sh --packages-only)", tool)
		}
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return err
	}
	if !set.IsSet(0) || !set.IsSet(c.collCPU) {
		return fmt.Errorf("need CPUs 0 and %d", c.collCPU)
	}
	return nil
}

func parseMethods(s string) ([]method, error) {
	var ms []method
	for _, f := range strings.Split(s, ",") {
		m := method(strings.TrimSpace(f))
		ok := false
		for _, a := range allMethods {
			ok = ok || a == m
		}
		if !ok {
			return nil, fmt.Errorf("unknown method %q", m)
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// floodRuns runs every method once per run, interleaved, so that ratios
// between methods come from the same run.
func floodRuns(ctx context.Context, cfg *floodConfig, ms []method, runs int, log io.Writer) ([][]floodResult, error) {
	var res [][]floodResult
	for i := 0; i < runs; i++ {
		var row []floodResult
		for _, m := range ms {
			r, err := floodOnce(ctx, cfg, m)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(log, "flood %s run %d/%d %-9s offered %d in %v, processed %d (model %.0f), rx cpu %.3fs = %.3f s/M offered\n",
				cfg.source, i+1, runs, m, r.Offered, r.Duration.Round(time.Millisecond), r.Processed, r.Model, r.RxCPU(), r.CPUPerMOffered())
			row = append(row, r)
		}
		res = append(res, row)
	}
	return res, nil
}

func tierTable(c *floodConfig) (tiers.Table, error) { return tiers.Compile(c.policy(), 0) }
