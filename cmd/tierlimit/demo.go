package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/traffic"
	"github.com/tierlimit/tierlimit/tiers"
)

func init() { subcommands = append(subcommands, newDemoCmd) }

type demoFlags struct {
	max    uint64
	window time.Duration
	loads  []float64
	// steps is the phase of each window's step (--loads L@φ): the
	// window offers the previous window's load until φ of it, then its
	// own; 0 for a window at its load throughout. Nil without steps.
	steps []float64
	// severity floods a mix of syslog severities under a severity block.
	severity bool
	noisy    bool // --noisy-source (demo_sources.go)
	auto     bool
	record   bool // --record (demo_record.go)
	// shape is --shape: the policy's shape, smooth unless set.
	shape tiers.Shape
	// fleet is --fleet N: N members sharing one budget (demo_fleet.go);
	// fleetBin the tierlimit binary they run (default: this one).
	fleet    int
	fleetBin string
	// chaos is --chaos: with --fleet, member 0 is cut off from the
	// store for a few windows (demo_fleet_chaos.go).
	chaos bool
}

func newDemoCmd(g *globals) *cobra.Command {
	var f demoFlags
	var loads, shape string
	cmd := &cobra.Command{
		Use:   "demo [--max N] [--window D] [--loads 0.5,1,2,5] [--shape smooth|ordinal] [--severity | --noisy-source | --auto | --record | --fleet N]",
		Short: "Watch the limiter shed a syslog flood in a throwaway sandbox",
		Long: `demo builds a sandbox (two network namespaces joined by a veth pair, nothing
in the host's namespace), attaches the limiter to the collector's end with the
seed's tiers scaled down to --max packets per --window, and floods UDP/514
syslog from the sender's end, one window per offered load (a multiple of max).
It prints, per window, what was offered, passed and dropped, by tier, beside
the model's expectation P(R), then removes the sandbox. Needs root. Each
window's packets are spread evenly over exactly one window, windows back to
back, so that a window's offered rate is its load: a window whose load is
the previous one's passes P(R) in both shapes; in the smooth shape a window
whose load rises passes more while its estimate of the load catches up
(docs/design.md §9).

A load may step within its window: --loads 0.5,0.5,10@0.6,10 offers 0.5 ×
max in the third window until 0.6 of it, then 10 × max: a flood arriving
on live traffic at a phase of the window (docs/design.md §4). With a step
each row ends with a tenths column, the passes received in each tenth of
the window.

Each window's row also shows how its passes spread over it, from the times
the collector's socket received them: the most received in a tenth of the
window beside the window's average tenth (passes / 10). --shape ordinal
(the seed's rule) passes a flood's window in a burst at its start, at the
flood's rate; --shape smooth (the default) spreads it over the window.

--noisy-source shows fair shedding instead: one sender floods at 10 × max
and five others send 4% of max each, under three policies side by side: no
budgets, per-source budgets (sources: {budget: 10%}), and the same budgets
with the noisy sender alone (a relay on a quiet collector). For two windows
of each it prints what each sender sent and got through, the collector's
total, and what the tiers' expectation P(R) gives each.

With --auto the policy has max: auto starting at --max, and a collector that
reads only a quarter of --max per window, behind a small receive buffer, is
flooded at twice --max per window for 30 windows: each row shows a judged
window, the collector's socket drops and the max the agent learnt.

--record shows the shed record: two senders flood at 6 and 3 × max and four
others send 4% of max each, for 6 windows; the shedding episode's RFC 5424
reports (open, a summary every second, close) print as a syslog listener on
the host's loopback receives them, then the last samples as tshark lists
them, each with its packet comment.

--fleet N shows a fleet sharing one budget (docs/design.md §12): it starts
redis-server (or valkey-server; one must be installed) in a namespace of its
own and N members, each running 'tierlimit run' in its own namespace with a
fleet.max of --max per --window, joined to the store's namespace. Each
window's load (a multiple of fleet.max, --loads) is split across the members
unevenly (60/30/10 for three); per window it prints each member's offered and
passed, the fleet's total beside the model's P(R_fleet), and what a static
max of --max ÷ N on each member would pass. With --chaos the busiest member
is cut off from the store (a firewall rule in its namespace; nft must be
installed) from the second window to the last but one, and each window's
total is printed beside the bound docs/design.md §12 states for the fleet's
fallback.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.parse(loads, shape); err != nil {
				return err
			}
			return f.run(cmd.Context(), g)
		},
	}
	cmd.Flags().Uint64Var(&f.max, "max", 1000, "selected packets per window the sandbox's collector is meant to handle")
	cmd.Flags().DurationVar(&f.window, "window", 500*time.Millisecond, "window length")
	cmd.Flags().StringVar(&loads, "loads", "0.5,1,1.5,2,3,5,10", "offered load of each window, as multiples of max; L@φ steps from the previous load to L at φ (0..1) of the window")
	cmd.Flags().StringVar(&shape, "shape", "smooth", "the policy's shape: smooth (passes spread over the window) or ordinal (the seed's rule: a burst at the window's start)")
	cmd.Flags().BoolVar(&f.severity, "severity", false, "flood 1% crit, 49% info, 50% debug under a severity block (protect emerg..err, shed debug first)")
	cmd.Flags().BoolVar(&f.noisy, "noisy-source", false, "show fair shedding: one heavy sender, five light ones, with and without per-source budgets")
	cmd.Flags().BoolVar(&f.record, "record", false, "show the shed record: two noisy senders, the episode's syslog reports and tshark-style samples")
	cmd.Flags().IntVar(&f.fleet, "fleet", 0, "run N members sharing one budget of --max through a redis-server the demo starts (2..8)")
	cmd.Flags().BoolVar(&f.chaos, "chaos", false, "with --fleet: cut the busiest member off from the store for a few windows and print the fleet's total against the partition bound")
	cmd.Flags().StringVar(&f.fleetBin, "fleet-bin", "", "the tierlimit binary the --fleet members run (default: this one)")
	cmd.Flags().MarkHidden("fleet-bin")
	cmd.Flags().BoolVar(&f.auto, "auto", false, "max: auto starting at --max, flooded at 2 × max into a collector that reads max/4 per window: watch max settle")
	return cmd
}

// parse checks the flags and reads --loads and --shape into f. Returns a
// usage error naming the flag.
func (f *demoFlags) parse(loads, shape string) error {
	for _, s := range strings.Split(loads, ",") {
		l, at, stepped := strings.Cut(strings.TrimSpace(s), "@")
		v, err := strconv.ParseFloat(l, 64)
		if err != nil || v <= 0 || v > 50 {
			return usageErrorf("--loads: %q: want multiples of max in (0, 50], each optionally @φ", s)
		}
		phase := 0.0
		if stepped {
			phase, err = strconv.ParseFloat(at, 64)
			if err != nil || !(phase > 0 && phase < 1) {
				return usageErrorf("--loads: %q: the step's phase %q: want a fraction of the window in (0, 1)", s, at)
			}
			if f.steps == nil {
				f.steps = make([]float64, len(f.loads), len(f.loads)+1)
			}
		}
		f.loads = append(f.loads, v)
		if f.steps != nil {
			f.steps = append(f.steps, phase)
		}
	}
	if f.max == 0 || f.max > 20000 {
		return usageErrorf("--max %d: want 1..20000 (the sandbox sends max × load packets per window)", f.max)
	}
	if f.window < 100*time.Millisecond || f.window > 10*time.Second {
		return usageErrorf("--window %v: want 100ms..10s", f.window)
	}
	if f.chaos && f.fleet == 0 {
		return usageErrorf("--chaos: with --fleet N only")
	}
	if f.fleet != 0 && (f.fleet < 2 || f.fleet > 8) {
		return usageErrorf("--fleet %d: want 2..8 members", f.fleet)
	}
	if f.steps != nil && (f.fleet != 0 || f.severity || f.noisy || f.auto || f.record) {
		return usageErrorf("--loads %q: a step (L@φ) is for the plain demo, not --fleet, --severity, --noisy-source, --auto or --record", loads)
	}
	if f.fleet != 0 && (f.severity || f.noisy || f.auto || f.record || shape == "ordinal") {
		return usageErrorf("--fleet: alone, with the smooth shape (--severity, --noisy-source, --auto, --record and --shape ordinal are other demos)")
	}
	var err error
	if f.shape, err = tiers.ParseShape(shape); err != nil {
		return usageErrorf("--shape %q: want smooth or ordinal", shape)
	}
	return nil
}

// run runs the demo the flags ask for.
func (f demoFlags) run(ctx context.Context, g *globals) error {
	switch {
	case f.fleet > 0:
		return runFleetDemo(ctx, g, f)
	case f.severity:
		return runSeverityDemo(ctx, g, f)
	case f.noisy:
		return runNoisyDemo(ctx, g, f)
	case f.record || f.auto:
		if os.Geteuid() != 0 {
			return agent.ErrNotRoot
		}
		if f.record {
			return runRecordDemo(ctx, g, f)
		}
		return runDemoAuto(ctx, g, f)
	}
	return runDemo(ctx, g, f)
}

// demoPolicy is the seed's policy scaled to f, selecting UDP 514 only.
func demoPolicy(f demoFlags) (tiers.Policy, error) {
	pol := tiers.Default()
	pol.Max, pol.Window, pol.Shape = f.max, f.window, f.shape
	pol.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 514, Last: 514}}}}
	if err := pol.Validate(); err != nil {
		return pol, configError{err}
	}
	return pol, nil
}

// demoRig is the demo's sandbox with the agent on the collector's veth end,
// a counting receiver on UDP 514 behind it and a sender on the other end.
type demoRig struct {
	pair *sandbox.Pair
	a    *agent.Agent
	recv *demoReceiver
	send *net.UDPConn
	dst  netip.AddrPort
	// steps is demoFlags.steps: windows reads it (nil: no steps).
	steps []float64
}

// newDemoRig builds the sandbox and starts the agent. Close it when done.
func newDemoRig(g *globals, pol tiers.Policy) (_ *demoRig, err error) {
	pair, err := sandbox.NewPair("tldemo")
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	r := &demoRig{pair: pair, dst: netip.AddrPortFrom(pair.CollAddr, 514)}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	err = pair.Coll.Do(func() (err error) {
		if r.a, err = agent.New(agent.Config{Interfaces: []string{pair.CollIf}, Logger: g.logger()}, pol); err != nil {
			return err
		}
		conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(r.dst))
		if err != nil {
			return err
		}
		conn.SetReadBuffer(8 << 20)
		if r.recv, err = newDemoReceiver(conn); err != nil {
			conn.Close()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	err = pair.Send.Do(func() (err error) { r.send, err = net.ListenUDP("udp", nil); return err })
	return r, err
}

// Close stops the agent, closes the sockets and removes the sandbox.
func (r *demoRig) Close() {
	if r.send != nil {
		r.send.Close()
	}
	if r.recv != nil {
		r.recv.Close()
	}
	if r.a != nil {
		r.a.Close()
	}
	r.pair.Close()
}

func runDemo(ctx context.Context, g *globals, f demoFlags) error {
	if os.Geteuid() != 0 {
		return agent.ErrNotRoot
	}
	pol, err := demoPolicy(f)
	if err != nil {
		return err
	}
	r, err := newDemoRig(g, pol)
	if err != nil {
		return err
	}
	defer r.Close()
	r.steps = f.steps
	pair := r.pair
	fmt.Fprintf(g.stdout, "sandbox: %s (%s, %s) <-veth-> %s (%s, %s)\npolicy: %s\n\n",
		pair.Send.Name, pair.SendIf, pair.SendAddr, pair.Coll.Name, pair.CollIf, pair.CollAddr, pol.String())

	// Rows print as each window ends, so columns have fixed widths.
	fmt.Fprintf(g.stdout, "%6s %8s %6s %8s %9s %8s %8s %8s", "window", "offered", "× max", "passed", "expected", "dropped", "top 1/10", "avg 1/10")
	for k := 0; k <= len(pol.Tiers); k++ {
		fmt.Fprintf(g.stdout, "  %14s", fmt.Sprintf("tier %d pass/drop", k))
	}
	if f.steps != nil {
		fmt.Fprintf(g.stdout, "  %s", "tenths")
	}
	fmt.Fprintln(g.stdout)
	return r.windows(ctx, pol, f.loads, func(i int, load float64, w *demoWindow) error {
		return r.printWindow(g, pol, i, load, w)
	}, func(i int, seq int) []byte { return traffic.SyslogMessage(i, seq) })
}

// demoWindow is one window of the demo: the program's counters before and
// after it, the datagrams of the window the collector socket received, and
// when the first was sent: the window opens at it.
type demoWindow struct {
	before, after bpf.Stats
	offered       int // datagrams sent in the window
	received      int64
	origin        time.Time
}

// windows offers load × max datagrams made by msg(i, seq) in window i for
// each of loads, windows back to back, each window's datagrams spread evenly
// over exactly one window, so that the offered rate is the window's load
// (the smooth shape judges by rate). A window the scheduler delays is
// finished late (within 10 windows) rather than cut, so that every row
// offers what it says, and the next starts when it ends. Each window's
// datagrams carry burst tag i. A window with a step (r.steps) offers the
// previous window's load (none before the first) until the step's phase,
// then its own, each part spread evenly over its span. row gets each window a tenth of a window
// after it ended (the next one is being sent meanwhile), with what the
// collector received of it; it returns nil when ctx ends first.
func (r *demoRig) windows(ctx context.Context, pol tiers.Policy, loads []float64, row func(i int, load float64, w *demoWindow) error, msg func(i, seq int) []byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan *demoWindow, len(loads))
	errc := make(chan error, 1)
	go func() {
		defer close(done)
		start := time.Now()
		for i, load := range loads {
			var lead demoLead
			if i < len(r.steps) && r.steps[i] > 0 {
				lead.frac = r.steps[i]
				if i > 0 {
					lead.count = int(loads[i-1] * lead.frac * float64(pol.Max))
				}
				load *= 1 - lead.frac
			}
			w, err := r.offer(ctx, pol, start, lead, int(load*float64(pol.Max)), func(seq int) []byte { return msg(i, seq) })
			if err != nil || w == nil {
				errc <- err
				return
			}
			done <- w
			start = w.origin.Add(pol.Window)
		}
		errc <- nil
	}()
	i := 0
	for w := range done {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pol.Window / 10):
		}
		w.received = int64(r.recv.Received(i))
		if err := row(i, loads[i], w); err != nil {
			return err
		}
		i++
	}
	return <-errc
}

// demoLead is the part of a window before its step: count datagrams over
// frac of the window. The zero value is no step.
type demoLead struct {
	count int
	frac  float64
}

// offer sends count datagrams made by msg in one window, which opens at
// start or, when that has passed, now, after lead's (spread over its
// fraction of the window, count over the rest), and returns the program's
// counters before and after it; nil when ctx ended first.
func (r *demoRig) offer(ctx context.Context, pol tiers.Policy, start time.Time, lead demoLead, count int, msg func(seq int) []byte) (*demoWindow, error) {
	var w demoWindow
	var err error
	select {
	case <-ctx.Done():
		return nil, nil
	case <-time.After(time.Until(start)):
	}
	if w.before, err = r.a.Limiter().Stats(); err != nil {
		return nil, err
	}
	w.origin = time.Now()
	rest := pol.Window
	if lead.frac > 0 {
		span := time.Duration(lead.frac * float64(pol.Window))
		rest -= span
		if lead.count == 0 {
			// Idle before the step.
			select {
			case <-ctx.Done():
				return nil, nil
			case <-time.After(span):
			}
		} else if _, err := traffic.Pace(ctx, r.send, r.dst, lead.count, span, 10*span, msg); err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			return nil, fmt.Errorf("send: %w", err)
		}
	}
	if _, err := traffic.Pace(ctx, r.send, r.dst, count, rest, 10*pol.Window, func(seq int) []byte { return msg(lead.count + seq) }); err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, fmt.Errorf("send: %w", err)
	}
	w.offered = lead.count + count
	if w.after, err = r.a.Limiter().Stats(); err != nil {
		return nil, err
	}
	return &w, nil
}

// printWindow prints window i, offered load × max: what passed and what
// dropped, by tier, beside the model's expectation.
func (r *demoRig) printWindow(g *globals, pol tiers.Policy, i int, load float64, w *demoWindow) error {
	offered := w.offered
	before, after := w.before, w.after
	e, err := tiers.Expected(pol, uint64(offered))
	if err != nil {
		return err
	}
	var dropped uint64
	var perTier strings.Builder
	for k := 0; k <= len(pol.Tiers); k++ {
		p := after.Selected[k][tiers.VerdictPass].Packets - before.Selected[k][tiers.VerdictPass].Packets
		d := after.Selected[k][tiers.VerdictDrop].Packets - before.Selected[k][tiers.VerdictDrop].Packets
		dropped += d
		fmt.Fprintf(&perTier, "  %16s", fmt.Sprintf("%d/%d", p, d))
	}
	tenths := r.recv.Tenths(i, w.origin, pol.Window)
	if r.steps != nil {
		s := make([]string, len(tenths))
		for k, v := range tenths {
			s[k] = strconv.Itoa(v)
		}
		fmt.Fprintf(&perTier, "  %s", strings.Join(s, ","))
	}
	fmt.Fprintf(g.stdout, "%6d %8d %6.1f %8d %9.0f %8d %8d %8.1f%s\n", i+1, offered, float64(offered)/float64(pol.Max), w.received, e.Passed, dropped,
		slices.Max(tenths), float64(w.received)/10, perTier.String())
	return nil
}
