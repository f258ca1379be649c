package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/automax"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/traffic"
	"github.com/tierlimit/tierlimit/tiers"
)

// demoAutoWindows is how many windows `demo --auto` floods.
const demoAutoWindows = 30

// runDemoAuto shows `max: auto` settle under a slow collector: a sandbox
// whose collector reads a quarter of --max per window, behind a receive
// buffer of about two windows of its reading, flooded at twice --max per
// window for demoAutoWindows windows. Each judged window prints a row.
func runDemoAuto(ctx context.Context, g *globals, f demoFlags) error {
	pol := tiers.Default()
	pol.Window, pol.Shape = f.window, f.shape
	pol.Auto = &tiers.AutoMax{Start: f.max, Floor: max(1, f.max/40), Ceiling: 5 * f.max}
	pol.Max = f.max
	pol.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 514, Last: 514}}}}
	if err := pol.Validate(); err != nil {
		return configError{err}
	}
	perSec := func(perWindow uint64) int { return int(float64(perWindow) / f.window.Seconds()) }
	offered, collRate := perSec(2*f.max), max(1, perSec(f.max/4))

	pair, err := sandbox.NewPair("tldemo")
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	defer pair.Close()
	fmt.Fprintf(g.stdout, "sandbox: %s (%s, %s) <-veth-> %s (%s, %s)\npolicy: %s\n",
		pair.Send.Name, pair.SendIf, pair.SendAddr, pair.Coll.Name, pair.CollIf, pair.CollAddr, pol.String())
	fmt.Fprintf(g.stdout, "flood: %d datagrams/s (2 × start); collector: reads %d/s (a quarter of start), so max should settle near %d\n\n",
		offered, collRate, uint64(float64(f.max)/4/0.88))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		a   *agent.Agent
		src automax.DropSource
	)
	err = pair.Coll.Do(func() (err error) {
		if a, err = agent.New(agent.Config{Interfaces: []string{pair.CollIf}, Logger: g.logger()}, pol); err != nil {
			return err
		}
		src, err = automax.OpenDropSource(false)
		return err
	})
	if a != nil {
		defer a.Close()
	}
	if err != nil {
		return err
	}
	am, err := a.StartAutoMax(ctx, pol, src)
	if err != nil {
		src.Close()
		return err
	}
	dst := netip.AddrPortFrom(pair.CollAddr, 514)
	// About two windows of the collector's reading, at ~1.1 KiB a datagram
	// (the kernel doubles SO_RCVBUF).
	coll, err := sandbox.NewSlowCollector(pair.Coll, dst, max(64<<10, collRate*int(f.window.Milliseconds())*1100/1000), collRate)
	if err != nil {
		return err
	}
	defer coll.Close()
	var send *net.UDPConn
	if err := pair.Send.Do(func() (err error) { send, err = net.ListenUDP("udp", nil); return err }); err != nil {
		return err
	}
	defer send.Close()

	d := time.Duration(demoAutoWindows) * f.window
	flood := make(chan error, 1)
	go func() {
		msg := func(i int) []byte { return traffic.SyslogMessage(0, i) }
		_, err := traffic.Pace(ctx, send, dst, int(float64(offered)*d.Seconds()), d, 2*d, msg)
		if ctx.Err() != nil {
			err = nil
		}
		flood <- err
	}()

	return printDemoAuto(ctx, g, f, am, coll, flood)
}

// settled returns the least, median and largest max of the last n windows
// of h (all of them when fewer).
func settled(h []automax.Window, n int) (lo, med, hi uint64) {
	var ms []uint64
	for _, w := range h[max(0, len(h)-n):] {
		ms = append(ms, w.Max)
	}
	if len(ms) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ms)
	return ms[0], ms[len(ms)/2], ms[len(ms)-1]
}

// printDemoAuto prints a row for each window the controller judged, until
// the flood ends (then the settled max) or ctx does.
func printDemoAuto(ctx context.Context, g *globals, f demoFlags, am *automax.Controller, coll *sandbox.SlowCollector, flood <-chan error) error {
	fmt.Fprintf(g.stdout, "%6s %8s %9s %12s %7s %7s  %s\n", "window", "offered", "delivered", "socket drops", "buffer", "max", "change")
	printed := 0
	tick := time.NewTicker(f.window / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-flood:
			if err != nil {
				return err
			}
			lo, med, hi := settled(am.History(), 10)
			fmt.Fprintf(g.stdout, "\nmax settled at %d (median of the last 10 windows, from %d to %d: the law probes above the collector and cuts back; the collector takes about %d per window); the collector read %d datagrams\n",
				med, lo, hi, uint64(float64(f.max)/4), coll.Read())
			return nil
		case <-tick.C:
		}
		h := am.History()
		for _, w := range h[min(printed, len(h)):] {
			printed++
			fmt.Fprintf(g.stdout, "%6d %8d %9d %12d %6.0f%% %7d  %s\n", printed, w.Offered, w.Delivered, w.SocketDrops, 100*w.Full, w.Max, w.Change)
		}
	}
}
