package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/tiers"
)

func init() { subcommands = append(subcommands, newDemoCmd) }

type demoFlags struct {
	max    uint64
	window time.Duration
	loads  []float64
	auto   bool
}

func newDemoCmd(g *globals) *cobra.Command {
	var f demoFlags
	var loads string
	cmd := &cobra.Command{
		Use:   "demo [--max N] [--window D] [--loads 0.5,1,2,5] [--auto]",
		Short: "Watch the limiter shed a syslog flood in a throwaway sandbox",
		Long: `demo builds a sandbox (two network namespaces joined by a veth pair, nothing
in the host's namespace), attaches the limiter to the collector's end with the
seed's tiers scaled down to --max packets per --window, and floods UDP/514
syslog from the sender's end, one window per offered load (a multiple of max).
It prints, per window, what was offered, passed and dropped, by tier, beside
the model's expectation, then removes the sandbox. Needs root.

With --auto the policy has max: auto starting at --max, and a collector that
reads only a quarter of --max per window, behind a small receive buffer, is
flooded at twice --max per window for 30 windows: each row shows a judged
window, the collector's socket drops and the max the agent learnt.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, s := range strings.Split(loads, ",") {
				v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
				if err != nil || v <= 0 || v > 50 {
					return usageErrorf("--loads: %q: want multiples of max in (0, 50]", s)
				}
				f.loads = append(f.loads, v)
			}
			if f.max == 0 || f.max > 20000 {
				return usageErrorf("--max %d: want 1..20000 (the sandbox sends max × load packets per window)", f.max)
			}
			if f.window < 100*time.Millisecond || f.window > 10*time.Second {
				return usageErrorf("--window %v: want 100ms..10s", f.window)
			}
			if f.auto {
				if os.Geteuid() != 0 {
					return agent.ErrNotRoot
				}
				return runDemoAuto(cmd.Context(), g, f)
			}
			return runDemo(cmd.Context(), g, f)
		},
	}
	cmd.Flags().Uint64Var(&f.max, "max", 1000, "selected packets per window the sandbox's collector is meant to handle")
	cmd.Flags().DurationVar(&f.window, "window", 500*time.Millisecond, "window length")
	cmd.Flags().StringVar(&loads, "loads", "0.5,1,1.5,2,3,5,10", "offered load of each window, as multiples of max")
	cmd.Flags().BoolVar(&f.auto, "auto", false, "max: auto starting at --max, flooded at 2 × max into a collector that reads max/4 per window: watch max settle")
	return cmd
}

func runDemo(ctx context.Context, g *globals, f demoFlags) error {
	if os.Geteuid() != 0 {
		return agent.ErrNotRoot
	}
	pol := tiers.Default()
	pol.Max, pol.Window = f.max, f.window
	pol.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 514, Last: 514}}}}
	if err := pol.Validate(); err != nil {
		return configError{err}
	}

	pair, err := sandbox.NewPair("tldemo")
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	defer pair.Close()
	fmt.Fprintf(g.stdout, "sandbox: %s (%s, %s) <-veth-> %s (%s, %s)\npolicy: %s\n\n",
		pair.Send.Name, pair.SendIf, pair.SendAddr, pair.Coll.Name, pair.CollIf, pair.CollAddr, pol.String())

	var a *agent.Agent
	var recv, send *net.UDPConn
	err = pair.Coll.Do(func() (err error) {
		if a, err = agent.New(agent.Config{Interfaces: []string{pair.CollIf}, Logger: g.logger()}, pol); err != nil {
			return err
		}
		recv, err = net.ListenUDP("udp", &net.UDPAddr{IP: pair.CollAddr.AsSlice(), Port: 514})
		return err
	})
	if a != nil {
		defer a.Close()
	}
	if err != nil {
		return err
	}
	defer recv.Close()
	recv.SetReadBuffer(8 << 20)
	if err := pair.Send.Do(func() (err error) { send, err = net.ListenUDP("udp", nil); return err }); err != nil {
		return err
	}
	defer send.Close()

	var received atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := recv.ReadFromUDP(buf); err != nil {
				return
			}
			received.Add(1)
		}
	}()

	// Rows print as each window ends, so columns have fixed widths.
	fmt.Fprintf(g.stdout, "%6s %8s %6s %8s %9s %8s", "window", "offered", "× max", "passed", "expected", "dropped")
	for k := 0; k <= len(pol.Tiers); k++ {
		fmt.Fprintf(g.stdout, "  %14s", fmt.Sprintf("tier %d pass/drop", k))
	}
	fmt.Fprintln(g.stdout)
	dst := &net.UDPAddr{IP: pair.CollAddr.AsSlice(), Port: 514}
	for i, load := range f.loads {
		offered := int(load * float64(f.max))
		before, err := a.Limiter().Stats()
		if err != nil {
			return err
		}
		got0 := received.Load()
		// One window per load: the burst spreads over 80% of the window and
		// the next starts more than a window after this one opened.
		if err := paceBurst(ctx, send, dst, i, offered, f.window*8/10); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.window * 4 / 10):
		}
		after, err := a.Limiter().Stats()
		if err != nil {
			return err
		}
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
		fmt.Fprintf(g.stdout, "%6d %8d %6.1f %8d %9.0f %8d%s\n", i+1, offered, load, received.Load()-got0, e.Passed, dropped, perTier.String())
	}
	return nil
}

// paceBurst sends n RFC 5424 datagrams spread evenly over spread.
func paceBurst(ctx context.Context, c *net.UDPConn, dst *net.UDPAddr, burst, n int, spread time.Duration) error {
	start := time.Now()
	for i := 0; i < n; {
		if err := ctx.Err(); err != nil {
			return nil
		}
		due := min(n, int(float64(n)*float64(time.Since(start))/float64(spread))+1)
		for ; i < due; i++ {
			msg := fmt.Appendf(nil, "<134>1 - demo-sender tierlimit - - - window=%d seq=%d", burst, i)
			if _, err := c.WriteToUDP(msg, dst); err != nil {
				if errors.Is(err, net.ErrClosed) {
					return nil
				}
				return fmt.Errorf("send: %w", err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}
