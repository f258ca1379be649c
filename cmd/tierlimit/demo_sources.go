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
	"github.com/tierlimit/tierlimit/internal/traffic"
	"github.com/tierlimit/tierlimit/tiers"
)

// demo --noisy-source: one heavy sender and several light ones, under no
// budgets, under per-source budgets, and the heavy one alone under budgets
// (docs/design.md §6).

const (
	noisyLight   = 5 // light senders
	noisyWindows = 2 // windows of each policy
	noisyBudget  = 10
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
	count map[int]map[netip.Addr]int // received, by window tag and source
}

// noisyCase is one of the demo's three columns: a policy, whether the light
// senders send, and per window what each sender sent and got through.
type noisyCase struct {
	name   string
	pol    tiers.Policy
	light  bool
	sent   [noisyWindows][]int
	passed [noisyWindows][]int
}

func runNoisyDemo(ctx context.Context, g *globals, f demoFlags) error {
	plain := tiers.Default()
	plain.Max, plain.Window, plain.Shape = f.max, f.window, f.shape
	plain.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 514, Last: 514}}}}
	fair := plain.Clone()
	fair.Sources = tiers.Sources{Budget: tiers.Pct(noisyBudget), PrefixV4: 32, PrefixV6: 64}
	if err := fair.Validate(); err != nil {
		return configError{err}
	}
	cases := []*noisyCase{
		{name: "no budgets", pol: plain, light: true},
		{name: fmt.Sprintf("budgets %d%%", noisyBudget), pol: fair, light: true},
		{name: "noisy alone", pol: fair},
	}
	d := &noisyDemo{g: g, f: f, count: map[int]map[netip.Addr]int{}}
	if err := d.setup(plain); err != nil {
		d.close()
		return err
	}
	defer d.close()
	fmt.Fprintf(g.stdout, "sandbox: %s (%s) <-veth-> %s (%s, %s)\nsenders: %s floods at 10 × max; %d others send 4%% of max each\n",
		d.pair.Send.Name, d.pair.SendIf, d.pair.Coll.Name, d.pair.CollIf, d.pair.CollAddr, d.srcs[0], noisyLight)
	fmt.Fprintf(g.stdout, "policies: %s\n          %s\n", plain.String(), fair.String())
	for i, c := range cases {
		if err := d.a.Reload(ctx, c.pol); err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: the old policy kept, as a Ctrl-C anywhere else
			}
			return err
		}
		// Each policy starts from idle: two windows without traffic, so
		// that no window remembers the previous policy's.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * f.window):
		}
		// The windows are back to back, each spread over one window, so
		// that the offered rate is the window's (the smooth shape judges
		// by rate); the collector counts each by its tag.
		start := time.Now()
		for w := range noisyWindows {
			sent, err := d.window(ctx, c.light, i*noisyWindows+w+1, start)
			if err != nil || ctx.Err() != nil {
				return err
			}
			c.sent[w] = sent
			start = start.Add(f.window)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.window / 5):
		}
		for w := range noisyWindows {
			c.passed[w] = d.passed(i*noisyWindows + w + 1)
		}
	}
	for w := range noisyWindows {
		if err := d.print(w, cases); err != nil {
			return err
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
		n, from, err := d.recv.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		w, _ := traffic.BurstOf(buf[:n])
		d.mu.Lock()
		if d.count[w] == nil {
			d.count[w] = map[netip.Addr]int{}
		}
		d.count[w][from.Addr().Unmap()]++
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

// window sends window n's traffic, the senders' datagrams (the noisy
// one's only, unless light) shuffled together and spread over one window
// from start (or now, when start has passed), each tagged n, and returns
// what each sender sent.
func (d *noisyDemo) window(ctx context.Context, light bool, n int, start time.Time) ([]int, error) {
	perLight := max(1, int(d.f.max*4/100))
	var order []int
	for i := range d.srcs {
		k := perLight
		switch {
		case i == 0:
			k = int(10 * d.f.max)
		case !light:
			k = 0
		}
		for range k {
			order = append(order, i)
		}
	}
	rand.New(rand.NewPCG(uint64(n), 1)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

	select {
	case <-ctx.Done():
		return nil, nil
	case <-time.After(time.Until(start)):
	}
	dst := &net.UDPAddr{IP: d.pair.CollAddr.AsSlice(), Port: 514}
	sent, _, err := d.pace(ctx, order, dst, n, d.f.window, d.f.window+d.f.window/50)
	return sent, err
}

// passed returns what the collector received of window n from each sender.
func (d *noisyDemo) passed(n int) []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	got := make([]int, len(d.srcs))
	for i, src := range d.srcs {
		got[i] = d.count[n][src]
	}
	return got
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
			msg := fmt.Appendf(nil, "<134>1 - demo-sender-%d tierlimit - - - burst=%d seq=%d", s, window, i)
			if _, err := d.send[s].WriteToUDP(msg, dst); err != nil {
				return sent, i, fmt.Errorf("send from %s: %w", d.srcs[s], err)
			}
			sent[s]++
		}
		time.Sleep(time.Millisecond)
	}
	return sent, i, nil
}

// print writes window w of the three cases side by side: per sender what
// it sent, what the collector received and what the tiers give it in
// expectation (noisyExpect); then the light senders' sum and the
// collector's total.
func (d *noisyDemo) print(w int, cases []*noisyCase) error {
	out := d.g.stdout
	note := ""
	if w == 0 {
		note = " (from idle: the flood's onset)"
	}
	fmt.Fprintf(out, "\nwindow %d%s\n  %-16s", w+1, note, "")
	exp := make([][]float64, len(cases))
	for k, c := range cases {
		fmt.Fprintf(out, " | %-24s", c.name)
		tab, err := tiers.Compile(c.pol, 0)
		if err != nil {
			return configError{err}
		}
		exp[k] = noisyExpect(tab, c.sent[w])
	}
	fmt.Fprintf(out, "\n  %-16s", "source")
	for range cases {
		fmt.Fprintf(out, " | %6s %8s %8s", "sent", "passed", "expect")
	}
	fmt.Fprintln(out)
	row := func(label string, idx []int, extra string) {
		fmt.Fprintf(out, "  %-16s", label)
		for k, c := range cases {
			var sent, passed int
			var e float64
			for _, i := range idx {
				sent, passed, e = sent+c.sent[w][i], passed+c.passed[w][i], e+exp[k][i]
			}
			fmt.Fprintf(out, " | %6d %8d %8.0f", sent, passed, e)
		}
		fmt.Fprintln(out, extra)
	}
	all := make([]int, len(d.srcs))
	for i, src := range d.srcs {
		all[i] = i
		extra := ""
		if i == 0 {
			extra = "  noisy"
		}
		row(src.String(), []int{i}, extra)
	}
	row("light", all[1:], "")
	row("total", all, "")
	return nil
}

// noisyExpect returns what each sender of a window gets through in
// expectation by the rule of docs/design.md §6, R the window's offered count:
// without budgets its share of P(R); with a budget B, its first B packets'
// share of P(R_in) and the rest's share of P(R) − P(R_in), R_in the
// window's in-budget count.
func noisyExpect(t tiers.Table, sent []int) []float64 {
	b := uint64(t.Sources.Budget)
	var r, rin uint64
	for _, s := range sent {
		r += uint64(s)
		if b > 0 {
			rin += min(uint64(s), b)
		}
	}
	share := func(part, of uint64, passes float64) float64 {
		if of == 0 {
			return 0
		}
		return float64(part) * passes / float64(of)
	}
	pin, ptot := t.Expected(rin).Passed, t.Expected(r).Passed
	out := make([]float64, len(sent))
	for i, s := range sent {
		if b == 0 {
			out[i] = share(uint64(s), r, ptot)
			continue
		}
		in := min(uint64(s), b)
		out[i] = share(in, rin, pin) + share(uint64(s)-in, r-rin, ptot-pin)
	}
	return out
}
