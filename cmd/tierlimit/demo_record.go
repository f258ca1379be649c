package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// demo --record: the shed record (docs/design.md §10). Two noisy senders and
// four light ones flood the sandbox's collector; the episode's reports are
// printed as a syslog listener receives them, then a few samples as tshark
// would list them.

const (
	recordWindows = 6 // windows of flood
	recordSamples = 8 // samples printed
)

func runRecordDemo(ctx context.Context, g *globals, f demoFlags) error {
	pol := tiers.Default()
	pol.Max, pol.Window = f.max, f.window
	pol.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 514, Last: 514}}}}
	// The events listener is on the host's loopback: the agent sends its
	// reports from its own namespace, off the limited path.
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	pol.Events = tiers.Events{Network: "udp", Addr: ln.LocalAddr().String(), SummaryEvery: time.Second}
	if err := pol.Validate(); err != nil {
		return configError{err}
	}
	d := &noisyDemo{g: g, f: f, count: map[int]map[netip.Addr]int{}}
	if err := d.setup(pol); err != nil {
		d.close()
		return err
	}
	defer d.close()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	ep, err := d.a.StartRecord(rctx, pol, "")
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "sandbox: %s (%s) <-veth-> %s (%s, %s)\nsenders: %s at 6 × max and %s at 3 × max; %d others at 4%% of max each\npolicy: %s\nrecord: %d samples/s, snaplen %d; events: udp://%s every %s\n\n",
		d.pair.Send.Name, d.pair.SendIf, d.pair.Coll.Name, d.pair.CollIf, d.pair.CollAddr, d.srcs[0], d.srcs[1], len(d.srcs)-2,
		pol.String(), pol.Record.Samples, pol.Record.Snaplen, pol.Events.Addr, pol.Events.SummaryEvery)
	printed := make(chan struct{})
	go func() { printReports(g, ln); close(printed) }()
	// The listener closes, and its printer ends, before the samples print.
	defer func() { ln.Close(); <-printed }()

	dst := &net.UDPAddr{IP: d.pair.CollAddr.AsSlice(), Port: 514}
	for w := range recordWindows {
		var order []int
		for i := range d.srcs {
			k := max(1, int(d.f.max*4/100))
			switch i {
			case 0:
				k = int(6 * d.f.max)
			case 1:
				k = int(3 * d.f.max)
			}
			for range k {
				order = append(order, i)
			}
		}
		rand.New(rand.NewPCG(uint64(w), 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		if _, _, err := d.pace(ctx, order, dst, w+1, f.window*8/10, f.window*9/10); err != nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(f.window / 5)
	}
	// The episode closes after record.QuietWindows quiet windows.
	deadline := time.Now().Add(time.Duration(record.QuietWindows+3) * max(f.window, 100*time.Millisecond))
	for ep.Current().Open && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the close report
	ln.Close()
	<-printed
	fmt.Fprintf(g.stdout, "\nsamples (%d kept in memory; the last %d, as tshark lists them, with their packet comments):\n",
		len(ep.Recorder().Recent()), recordSamples)
	recent := ep.Recorder().Recent()
	recent = recent[max(0, len(recent)-recordSamples):]
	for i, s := range recent {
		fmt.Fprintf(g.stdout, "%s\n", tsharkLine(i+1, s, recent[0].Mono))
	}
	return nil
}

// printReports prints each report the listener receives until it closes.
func printReports(g *globals, ln net.PacketConn) {
	buf := make([]byte, 8192)
	for {
		n, _, err := ln.ReadFrom(buf)
		if err != nil {
			return
		}
		fmt.Fprintf(g.stdout, "syslog <- %s\n", buf[:n])
	}
}

// tsharkLine renders a sample as tshark's one-line summary: number, time
// relative to the first, source, destination, protocol, length, info; then
// its comment.
func tsharkLine(n int, s bpf.Sample, t0 time.Duration) string {
	src, dst, proto, info := "?", "?", "?", ""
	p := gopacket.NewPacket(s.Data, layers.LayerTypeEthernet, gopacket.Lazy)
	if nl := p.NetworkLayer(); nl != nil {
		src, dst = nl.NetworkFlow().Src().String(), nl.NetworkFlow().Dst().String()
	}
	if udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
		proto = "Syslog"
		info = strings.TrimSpace(string(udp.Payload))
		if len(info) > 48 {
			info = info[:48] + "…"
		}
	}
	return fmt.Sprintf("%4d %10.6f %-15s → %-15s %-6s %4d %s\n     [%s]", n, (s.Mono - t0).Seconds(), src, dst, proto, s.Len, info, record.SampleComment(s))
}
