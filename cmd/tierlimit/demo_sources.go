package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/tiers"
)

// demo --noisy-source: one heavy sender and several light ones, with and
// without per-source budgets (DESIGN.md §6).

const (
	noisyLight   = 5 // light senders
	noisyWindows = 2 // windows with sources, then as many without
)

// noisyDemo is the sandbox of demo --noisy-source.
type noisyDemo struct {
	g     *globals
	f     demoFlags
	pair  *sandbox.Pair
	a     *agent.Agent
	srcs  []netip.Addr // noisy first
	send  []*net.UDPConn
	recv  *net.UDPConn
	mu    sync.Mutex
	count map[netip.Addr]int // received, by source
}

func runNoisyDemo(ctx context.Context, g *globals, f demoFlags) error {
	plain := tiers.Default()
	plain.Max, plain.Window = f.max, f.window
	plain.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 514, Last: 514}}}}
	fair := plain.Clone()
	fair.Sources = tiers.Sources{Budget: tiers.Pct(10), PrefixV4: 32, PrefixV6: 64}
	if err := fair.Validate(); err != nil {
		return configError{err}
	}
	d := &noisyDemo{g: g, f: f, count: map[netip.Addr]int{}}
	if err := d.setup(fair); err != nil {
		d.close()
		return err
	}
	defer d.close()
	fmt.Fprintf(g.stdout, "sandbox: %s (%s) <-veth-> %s (%s, %s)\nsenders: %s floods at 10 × max; %d others send 4%% of max each\n",
		d.pair.Send.Name, d.pair.SendIf, d.pair.Coll.Name, d.pair.CollIf, d.pair.CollAddr, d.srcs[0], noisyLight)
	for i, p := range []tiers.Policy{fair, plain} {
		if i > 0 {
			if err := d.a.Reload(p); err != nil {
				return err
			}
		}
		fmt.Fprintf(g.stdout, "\npolicy: %s\n", p.String())
		for w := range noisyWindows {
			if err := d.window(ctx, p, i*noisyWindows+w+1); err != nil || ctx.Err() != nil {
				return err
			}
		}
	}
	return nil
}

// setup builds the sandbox, the agent, the receiver and one socket per
// sender address (198.51.100.10 noisy, .20 on light).
func (d *noisyDemo) setup(pol tiers.Policy) error {
	var err error
	if d.pair, err = sandbox.NewPair("tldemo"); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	err = d.pair.Coll.Do(func() (err error) {
		if d.a, err = agent.New(agent.Config{Interfaces: []string{d.pair.CollIf}, Logger: d.g.logger()}, pol); err != nil {
			return err
		}
		d.recv, err = net.ListenUDP("udp", &net.UDPAddr{IP: d.pair.CollAddr.AsSlice(), Port: 514})
		return err
	})
	if err != nil {
		return err
	}
	d.recv.SetReadBuffer(8 << 20)
	for i := range noisyLight + 1 {
		d.srcs = append(d.srcs, netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + 10*min(i, 1) + max(i-1, 0))}))
	}
	err = d.pair.Send.Do(func() error {
		l, err := netlink.LinkByName(d.pair.SendIf)
		if err != nil {
			return err
		}
		for _, src := range d.srcs {
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: src.AsSlice(), Mask: net.CIDRMask(24, 32)}, Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrAdd(l, addr); err != nil {
				return fmt.Errorf("add sender address %s: %w", src, err)
			}
			c, err := net.ListenUDP("udp", &net.UDPAddr{IP: src.AsSlice()})
			if err != nil {
				return err
			}
			d.send = append(d.send, c)
		}
		return nil
	})
	if err != nil {
		return err
	}
	go d.receive()
	return nil
}

func (d *noisyDemo) receive() {
	buf := make([]byte, 2048)
	for {
		_, from, err := d.recv.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		d.mu.Lock()
		d.count[from.Addr().Unmap()]++
		d.mu.Unlock()
	}
}

func (d *noisyDemo) close() {
	for _, c := range d.send {
		c.Close()
	}
	if d.recv != nil {
		d.recv.Close()
	}
	if d.a != nil {
		d.a.Close()
	}
	if d.pair != nil {
		d.pair.Close()
	}
}

// window sends one window's traffic, the senders' datagrams shuffled
// together and spread over 80% of the window, and prints per sender what
// was sent, what the collector received and what the model passes of the
// same sequence.
func (d *noisyDemo) window(ctx context.Context, p tiers.Policy, n int) error {
	light := max(1, int(d.f.max*4/100))
	var order []int
	for i := range d.srcs {
		k := light
		if i == 0 {
			k = int(10 * d.f.max)
		}
		for range k {
			order = append(order, i)
		}
	}
	rand.New(rand.NewPCG(uint64(n), 1)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

	d.mu.Lock()
	before := make(map[netip.Addr]int, len(d.count))
	for k, v := range d.count {
		before[k] = v
	}
	d.mu.Unlock()

	dst := &net.UDPAddr{IP: d.pair.CollAddr.AsSlice(), Port: 514}
	sent, k, err := d.pace(ctx, order, dst, n, d.f.window*8/10, d.f.window*9/10)
	if err != nil {
		return err
	}
	tab, err := tiers.Compile(p)
	if err != nil {
		return configError{err}
	}
	m := tiers.NewModel(p, tab, nil)
	m.SetSketchSeeds(d.a.Limiter().SketchSeeds())
	model := make([]int, len(d.srcs))
	for _, i := range order[:k] {
		if m.PacketFrom(0, d.srcs[i]).Verdict == tiers.VerdictPass {
			model[i]++
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(d.f.window * 4 / 10):
	}
	d.print(n, sent, model, before)
	return nil
}

// pace sends order's datagrams (each the index of its sender) spread over
// spread, and returns how many each sender sent and how many of order went
// out. A burst the scheduler delays past budget stops there, so that it
// stays in its window.
func (d *noisyDemo) pace(ctx context.Context, order []int, dst *net.UDPAddr, window int, spread, budget time.Duration) ([]int, int, error) {
	sent := make([]int, len(d.srcs))
	start := time.Now()
	i := 0
	for i < len(order) {
		if ctx.Err() != nil || time.Since(start) > budget {
			return sent, i, nil
		}
		due := min(len(order), int(float64(len(order))*float64(time.Since(start))/float64(spread))+1)
		for ; i < due; i++ {
			s := order[i]
			msg := fmt.Appendf(nil, "<134>1 - demo-sender-%d tierlimit - - - window=%d seq=%d", s, window, i)
			if _, err := d.send[s].WriteToUDP(msg, dst); err != nil {
				return sent, i, fmt.Errorf("send from %s: %w", d.srcs[s], err)
			}
			sent[s]++
		}
		time.Sleep(time.Millisecond)
	}
	return sent, i, nil
}

func (d *noisyDemo) print(n int, sent, model []int, before map[netip.Addr]int) {
	out := d.g.stdout
	fmt.Fprintf(out, "window %d\n  %-16s %8s %8s %8s\n", n, "source", "sent", "passed", "model")
	var ts, tp, tm int
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, src := range d.srcs {
		got := d.count[src] - before[src]
		label := ""
		if i == 0 {
			label = "  noisy"
		}
		fmt.Fprintf(out, "  %-16s %8d %8d %8d%s\n", src, sent[i], got, model[i], label)
		ts, tp, tm = ts+sent[i], tp+got, tm+model[i]
	}
	fmt.Fprintf(out, "  %-16s %8d %8d %8d\n", "total", ts, tp, tm)
}
