package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/tiers"
)

// method is one way of shedding the flood.
type method string

const (
	methodNone method = "none"
	methodXDP  method = "tierlimit"
	methodNFT  method = "nftables"
	methodApp  method = "in-app"
)

var allMethods = []method{methodNone, methodXDP, methodNFT, methodApp}

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
// udp 514) with max and window set.
func benchPolicy(max uint64, window time.Duration) tiers.Policy {
	p := tiers.Default()
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

// bench is one sandbox: a pair of namespaces, the method's limiter, the
// collector process and what is needed to flood it. close undoes it all.
type bench struct {
	cfg   *floodConfig
	m     method
	pair  *sandbox.Pair
	lim   *bpf.Limiter
	xdp   link.Link
	recv  *receiver
	napi  int // pid of the collector veth's NAPI thread
	conf  string
	frame []byte
	gen   *xdpTxGen
	sent  atomic.Uint64 // frames the xdp-tx generator sent
	send  *netlink.Handle
	coll  *netlink.Handle
	undo  []func()
}

func (b *bench) close() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		b.undo[i]()
	}
	b.undo = nil
}

// setup builds the sandbox for method m: veth pair, limiter, threaded NAPI
// pinned to collCPU, and a receiver on collCPU.
func setup(ctx context.Context, cfg *floodConfig, m method) (_ *bench, err error) {
	b := &bench{cfg: cfg, m: m}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if b.pair, err = sandbox.NewPair("tlbench"); err != nil {
		return nil, err
	}
	b.undo = append(b.undo, func() {
		if err := b.pair.Close(); err != nil {
			fmt.Fprintln(cfg.log, "cleanup:", err)
		}
	})
	p := b.pair
	// Every frame goes through the collector veth's NAPI: veth hands a
	// frame to NAPI only when the sender's veth does no TSO (an XDP
	// program turns it off by itself) and the collector has XDP or GRO.
	if err := run1(ctx, p.Send.Command(ctx, "ethtool", "-K", p.SendIf, "tso", "off")); err != nil {
		return nil, err
	}
	switch m {
	case methodXDP:
		if err := b.attachXDP(); err != nil {
			return nil, err
		}
	default:
		if err := run1(ctx, p.Coll.Command(ctx, "ethtool", "-K", p.CollIf, "gro", "on")); err != nil {
			return nil, err
		}
	}
	if m == methodNFT {
		if err := b.loadNFT(ctx); err != nil {
			return nil, err
		}
	}
	if b.napi, err = threadedNAPI(ctx, p, cfg.collCPU); err != nil {
		return nil, err
	}
	if b.conf, err = b.trafgenConf(); err != nil {
		return nil, err
	}
	h, err := netns.GetFromName(p.Send.Name)
	if err != nil {
		return nil, err
	}
	b.send, err = netlink.NewHandleAt(h)
	h.Close()
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, b.send.Close)
	if h, err = netns.GetFromName(p.Coll.Name); err != nil {
		return nil, err
	}
	b.coll, err = netlink.NewHandleAt(h)
	h.Close()
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, b.coll.Close)
	if cfg.source == "xdp-tx" {
		if b.gen, err = newXDPTxGen(); err != nil {
			return nil, err
		}
		b.undo = append(b.undo, func() { b.gen.Close() })
	}
	if b.recv, err = startReceiver(ctx, cfg, p, m == methodApp); err != nil {
		return nil, err
	}
	b.undo = append(b.undo, b.recv.stop)
	return b, nil
}

// attachXDP loads tierlimit with the policy and attaches it in native mode
// (veth's own XDP) to the collector's veth, inside its namespace.
func (b *bench) attachXDP() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	tick, _ := bpf.KernelTick()
	l, err := bpf.Load(bpf.Options{TickNs: tick})
	if err != nil {
		return err
	}
	b.lim = l
	b.undo = append(b.undo, func() { l.Close() })
	p := b.cfg.policy()
	tab, err := tiers.Compile(p)
	if err != nil {
		return err
	}
	if err := l.Apply(p, tab); err != nil {
		return err
	}
	return b.pair.Coll.Do(func() error {
		ifc, err := net.InterfaceByName(b.pair.CollIf)
		if err != nil {
			return err
		}
		lk, err := link.AttachXDP(link.XDPOptions{Program: l.Program(), Interface: ifc.Index, Flags: link.XDPDriverMode})
		if err != nil {
			return fmt.Errorf("attach xdp to %s: %w", b.pair.CollIf, err)
		}
		b.xdp = lk
		b.undo = append(b.undo, func() { lk.Close() })
		return nil
	})
}

// loadNFT loads the nftables equivalent of the policy into the collector's
// namespace (and only there: nft runs inside it; flush ruleset empties that
// namespace's rule set alone).
func (b *bench) loadNFT(ctx context.Context) error {
	rules, err := nftRules(b.cfg.policy(), b.pair.CollIf)
	if err != nil {
		return err
	}
	f := filepath.Join(b.cfg.tmp, "tierlimit-bench-"+b.pair.CollIf+".nft")
	if err := os.WriteFile(f, []byte(rules), 0o644); err != nil {
		return err
	}
	b.undo = append(b.undo, func() { os.Remove(f) })
	return run1(ctx, b.pair.Coll.Command(ctx, "nft", "-f", f))
}

// threadedNAPI switches the collector veth's NAPI to a kernel thread, pins
// that thread to cpu and returns its pid. Without it, veth runs the
// receiver's NAPI in softirq on the sending CPU, which would book the
// receive work to the sender.
func threadedNAPI(ctx context.Context, p *sandbox.Pair, cpu int) (int, error) {
	// sysfs shows a namespace's devices only to a sysfs mounted inside it:
	// ip netns exec mounts one for the command.
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", p.Coll.Name, "sh", "-c",
		"echo 1 > /sys/class/net/"+p.CollIf+"/threaded")
	if err := run1(ctx, cmd); err != nil {
		return 0, fmt.Errorf("threaded napi on %s: %w", p.CollIf, err)
	}
	// The thread is "napi/<ifname>-<napi id>", cut to 15 characters.
	prefix := "napi/" + p.CollIf
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return 0, err
		}
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			if err != nil || !strings.HasPrefix(string(comm), prefix) {
				continue
			}
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(pid, &set); err != nil {
				return 0, fmt.Errorf("pin %s to cpu %d: %w", strings.TrimSpace(string(comm)), cpu, err)
			}
			return pid, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("no NAPI thread %s* found", prefix)
}

// frame is the flood's syslog datagram from the sender to the collector,
// built with gopacket (checksums included).
func frame(srcMAC, dstMAC net.HardwareAddr, src, dst net.IP) ([]byte, error) {
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP, SrcIP: src.To4(), DstIP: dst.To4()}
	udp := &layers.UDP{SrcPort: 40514, DstPort: 514}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		return nil, err
	}
	msg := gopacket.Payload("<134>1 2026-11-29T17:00:00.000Z sender tierlimit-bench 4242 ID47 - flood message")
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, udp, msg); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// trafgenConfig is a trafgen packet configuration that sends f.
func trafgenConfig(f []byte) string {
	var sb strings.Builder
	sb.WriteString("/* tierlimit-bench: one syslog datagram, built with gopacket */\n{")
	for i, c := range f {
		if i%12 == 0 {
			sb.WriteString("\n ")
		}
		fmt.Fprintf(&sb, " 0x%02x,", c)
	}
	sb.WriteString("\n}\n")
	return sb.String()
}

func (b *bench) trafgenConf() (string, error) {
	var srcMAC, dstMAC net.HardwareAddr
	err := b.pair.Send.Do(func() error {
		l, err := netlink.LinkByName(b.pair.SendIf)
		if err == nil {
			srcMAC = l.Attrs().HardwareAddr
		}
		return err
	})
	if err != nil {
		return "", err
	}
	err = b.pair.Coll.Do(func() error {
		l, err := netlink.LinkByName(b.pair.CollIf)
		if err == nil {
			dstMAC = l.Attrs().HardwareAddr
		}
		return err
	})
	if err != nil {
		return "", err
	}
	f, err := frame(srcMAC, dstMAC, b.pair.SendAddr.AsSlice(), b.pair.CollAddr.AsSlice())
	if err != nil {
		return "", err
	}
	b.frame = f
	name := filepath.Join(b.cfg.tmp, "tierlimit-bench-"+b.pair.SendIf+".cfg")
	if err := os.WriteFile(name, []byte(trafgenConfig(f)), 0o644); err != nil {
		return "", err
	}
	b.undo = append(b.undo, func() { os.Remove(name) })
	return name, nil
}

// sample is the flood's counters at a time since it started.
type sample struct {
	t time.Duration
	// offered counts frames sent: the sender veth's tx_packets (trafgen) or
	// the generator's count (xdp-tx).
	offered uint64
	// retries is the sender veth's tx_dropped: with trafgen, sends refused
	// because the collector's ring was full, which trafgen retries.
	retries uint64
	// arrived is the collector veth's rx_packets: frames its NAPI took off
	// the ring (XDP drops included).
	arrived uint64
	// window state of the XDP program, when there is one
	opened, lastCount, count uint64
}

func (b *bench) sample(t0 time.Time) (sample, error) {
	l, err := b.send.LinkByName(b.pair.SendIf)
	if err != nil {
		return sample{}, err
	}
	st := l.Attrs().Statistics
	s := sample{t: time.Since(t0), offered: st.TxPackets, retries: st.TxDropped}
	if b.gen != nil {
		s.offered = b.sent.Load()
	}
	if l, err = b.coll.LinkByName(b.pair.CollIf); err != nil {
		return sample{}, err
	}
	s.arrived = l.Attrs().Statistics.RxPackets
	if b.lim != nil {
		w, err := b.lim.Window()
		if err != nil {
			return sample{}, err
		}
		s.opened, s.lastCount, s.count = w.Opened, w.LastCount, w.Count
	}
	return s, nil
}

// flood sends n frames from the configured source, sampling the counters
// every 5 ms, and returns the samples and the time it started. trafgen is
// bounded by -n and by a deadline; it runs in its own process group, which
// is killed whole if it overruns (its worker is a forked child). The
// generator is bounded by n and the same deadline.
func (b *bench) flood(ctx context.Context, n uint64) ([]sample, time.Time, error) {
	// At least 20k frames/s, or it is stopped.
	limit := time.Duration(n/20_000)*time.Second + 10*time.Second
	tctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	done := make(chan error, 1)
	var start func() error
	var out strings.Builder
	if b.gen != nil {
		start = func() error {
			go func() {
				done <- b.gen.run(tctx, b.pair.Send, b.pair.SendIf, b.cfg.senderCPU, b.frame, n, b.cfg.rate, &b.sent)
			}()
			return nil
		}
	} else {
		// trafgen's slow path (-t 0ns: one sendto per frame, no gap) retries
		// when the collector's ring is full; its TX_RING fast path exits.
		args := []string{"--dev", b.pair.SendIf, "--conf", b.conf, "-n", strconv.FormatUint(n, 10),
			"-P", "1", "-t", "0ns", "--no-sock-mem", "--notouch-irq", "--no-cpu-stats"}
		cmd := b.pair.Send.Command(tctx, "trafgen", args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 2 * time.Second
		cmd.Stdout, cmd.Stderr = &out, &out
		start = func() error {
			if err := cmd.Start(); err != nil {
				return fmt.Errorf("start trafgen: %w", err)
			}
			go func() { done <- cmd.Wait() }()
			return nil
		}
	}

	t0 := time.Now()
	first, err := b.sample(t0)
	if err != nil {
		return nil, t0, err
	}
	samples := []sample{first}
	if err := start(); err != nil {
		return nil, t0, err
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var werr, serr error
loop:
	for {
		select {
		case werr = <-done:
			break loop
		case <-tick.C:
			s, err := b.sample(t0)
			if err != nil && serr == nil {
				serr = err
				cancel()
			}
			samples = append(samples, s)
		}
	}
	if err := errors.Join(werr, serr); err != nil {
		return nil, t0, fmt.Errorf("%s: %w %s", b.cfg.source, err, strings.TrimSpace(out.String()))
	}
	return samples, t0, nil
}

// settle waits until the receiver's count stops moving (at most 3 s), then
// takes a last sample.
func (b *bench) settle(ctx context.Context, t0 time.Time) (receiverStats, error) {
	var last receiverStats
	for i := 0; i < 60; i++ {
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return last, err
		}
		st, err := b.recv.stats()
		if err != nil {
			return last, err
		}
		if i > 0 && st.Received == last.Received {
			return st, nil
		}
		last = st
	}
	return last, nil
}

// cpuSnap is the receive side's CPU counters at one time.
type cpuSnap struct {
	napi, recv          int64 // ns (schedstat)
	softirq, sndSoftirq int64 // ns (/proc/stat, in USER_HZ ticks)
}

func (b *bench) cpu() (cpuSnap, error) {
	var s cpuSnap
	var err error
	if s.napi, err = taskNs(b.napi); err != nil {
		return s, err
	}
	if s.recv, err = taskNs(b.recv.pid()); err != nil {
		return s, err
	}
	if s.softirq, err = irqNs(b.cfg.collCPU); err != nil {
		return s, err
	}
	if s.sndSoftirq, err = irqNs(b.cfg.senderCPU); err != nil {
		return s, err
	}
	return s, nil
}

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

	tab, err := tiers.Compile(cfg.policy())
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

// xdpModel is the expected passed count from the program's own count of
// each window: last_count when a window opened, and count for the last.
func xdpModel(tab tiers.Table, samples []sample) float64 {
	var sum float64
	prev := samples[0].opened
	for _, s := range samples[1:] {
		if s.opened > prev+1 {
			// A window opened and closed between two samples: unseen.
			return 0
		}
		if s.opened == prev+1 && prev > samples[0].opened {
			sum += tab.Expected(s.lastCount).Passed
		}
		prev = s.opened
	}
	return sum + tab.Expected(samples[len(samples)-1].count).Passed
}

// timeline is a cumulative count over time, piecewise linear between
// samples.
type timeline []point

type point struct {
	t time.Duration
	c uint64
}

func timelineOf(samples []sample, f func(sample) uint64) timeline {
	tl := make(timeline, len(samples))
	for i, s := range samples {
		tl[i] = point{s.t, f(s)}
	}
	return tl
}

// duration is from the first packet to the sample that shows the last.
func (tl timeline) duration() time.Duration {
	final, end := tl[len(tl)-1].c, tl[len(tl)-1].t
	for _, p := range tl {
		if p.c == final {
			end = p.t
			break
		}
	}
	return end - tl.firstPacket()
}

// firstPacket is the time of the sample before the one that first shows
// traffic.
func (tl timeline) firstPacket() time.Duration {
	for i := 1; i < len(tl); i++ {
		if tl[i].c > tl[0].c {
			return tl[i-1].t
		}
	}
	return tl[0].t
}

// at is the count at t, interpolated.
func (tl timeline) at(t time.Duration) float64 {
	if t <= tl[0].t {
		return float64(tl[0].c)
	}
	for i := 1; i < len(tl); i++ {
		if t <= tl[i].t {
			a, b := tl[i-1], tl[i]
			f := float64(t-a.t) / float64(b.t-a.t)
			return float64(a.c) + f*(float64(b.c)-float64(a.c))
		}
	}
	return float64(tl[len(tl)-1].c)
}

// model applies the window rule to the timeline of frames that reached the
// collector (a window opens at the first packet after the current one's
// end; the flood is continuous, so at that end) and sums tiers.Expected
// over the windows. With samples every 5 ms it can misplace a boundary by
// 5 ms of traffic, which moves the expectation only for a window that is
// not saturated (fewer than T_last packets).
func (tl timeline) model(tab tiers.Table, window time.Duration) (float64, int) {
	total := float64(tl[len(tl)-1].c)
	start := tl.firstPacket()
	var sum float64
	n := 0
	for {
		from := tl.at(start)
		if from >= total-0.5 {
			break
		}
		to := tl.at(start + window)
		sum += tab.Expected(uint64(to - from + 0.5)).Passed
		n++
		start += window
	}
	return sum, n
}

// receiver is the collector process, run inside the collector namespace
// and pinned to collCPU with taskset.
type receiver struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	mu   sync.Mutex
	done chan error
}

func startReceiver(ctx context.Context, cfg *floodConfig, p *sandbox.Pair, limit bool) (*receiver, error) {
	args := []string{"-c", strconv.Itoa(cfg.collCPU), "nsenter", "--net=" + p.Coll.Path, "--", cfg.self, "receive",
		"-addr", p.CollAddr.String() + ":514"}
	if limit {
		args = append(args, "-limit", "-max", strconv.FormatUint(cfg.max, 10), "-window", cfg.window.String())
	}
	cmd := exec.CommandContext(ctx, "taskset", args...)
	cmd.Stderr = cfg.log
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start receiver: %w", err)
	}
	r := &receiver{cmd: cmd, in: in, out: bufio.NewScanner(out), done: make(chan error, 1)}
	ready := make(chan bool, 1)
	go func() { ready <- r.out.Scan() && r.out.Text() == "ready" }()
	select {
	case ok := <-ready:
		if !ok {
			r.stop()
			return nil, errors.New("receiver did not start")
		}
	case <-time.After(10 * time.Second):
		r.stop()
		return nil, errors.New("receiver not ready after 10s")
	}
	return r, nil
}

func (r *receiver) pid() int { return r.cmd.Process.Pid }

// stats asks the receiver for its counters.
func (r *receiver) stats() (receiverStats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var st receiverStats
	if _, err := io.WriteString(r.in, "stats\n"); err != nil {
		return st, err
	}
	if !r.out.Scan() {
		return st, fmt.Errorf("receiver: no stats: %v", r.out.Err())
	}
	return st, json.Unmarshal(r.out.Bytes(), &st)
}

// stop closes the receiver's stdin, which ends it, and kills it if it
// does not exit within 2 s.
func (r *receiver) stop() {
	r.in.Close()
	go func() { r.done <- r.cmd.Wait() }()
	select {
	case <-r.done:
	case <-time.After(2 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
	}
}

// taskNs sums the run time (schedstat, ns) of every thread of pid.
func taskNs(pid int) (int64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// userHZ is the unit of /proc/stat (USER_HZ, 100 on Linux).
const userHZ = 100

// irqNs is irq + softirq time of cpu from /proc/stat, in ns.
func irqNs(cpu int) (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	name := "cpu" + strconv.Itoa(cpu)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || f[0] != name {
			continue
		}
		irq, err1 := strconv.ParseInt(f[6], 10, 64)
		soft, err2 := strconv.ParseInt(f[7], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, err
		}
		return (irq + soft) * (1e9 / userHZ), nil
	}
	return 0, fmt.Errorf("no %s in /proc/stat", name)
}

// udpRcvbufErrors is Udp RcvbufErrors of the namespace pid runs in.
func udpRcvbufErrors(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/snmp", pid))
	if err != nil {
		return 0, err
	}
	var head []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "Udp: ") {
			continue
		}
		f := strings.Fields(line)
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "RcvbufErrors" && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
	}
	return 0, errors.New("no Udp RcvbufErrors")
}

// run1 runs cmd and returns its output in the error.
func run1(_ context.Context, cmd *exec.Cmd) error {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
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

// xdpTxGen is the second flood source: a live-frames XDP_TX generator on
// the sender's veth. BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES runs
// a program that returns XDP_TX on a real xdp_frame per repetition, and the
// kernel sends each frame out of the ingress device, here into the
// collector's veth ring as an xdp_frame: no skb exists until the collector
// builds one, as with a NIC driver. It runs on a locked thread in the sender
// namespace, pinned to the sender CPU, paced to a rate.
type xdpTxGen struct {
	prog *ebpf.Program
}

func newXDPTxGen() (*xdpTxGen, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, err
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "tlbench_tx",
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 3 /* XDP_TX */), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		return nil, fmt.Errorf("load xdp_tx generator: %w", err)
	}
	return &xdpTxGen{prog: prog}, nil
}

func (g *xdpTxGen) Close() error { return g.prog.Close() }

// xdpMD is struct xdp_md, the BPF_PROG_TEST_RUN context of XDP.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// run sends n copies of f out of ifname in ns at rate frames per second
// (0: as fast as it can), batch frames per call, adding each batch to sent.
func (g *xdpTxGen) run(ctx context.Context, ns *sandbox.NS, ifname string, cpu int, f []byte, n uint64, rate float64, sent *atomic.Uint64) error {
	return ns.Do(func() error {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return err
		}
		// The thread's affinity and signal mask change: it is not reused.
		runtime.LockOSThread()
		// An interrupted live run is restarted whole by cilium/ebpf, which
		// would send frames twice: keep the runtime's SIGURG away.
		var block unix.Sigset_t
		block.Val[0] = 1 << (uint(unix.SIGURG) - 1)
		if err := unix.PthreadSigmask(unix.SIG_BLOCK, &block, nil); err != nil {
			return err
		}
		ifc, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		md := xdpMD{DataEnd: uint32(len(f)), IngressIfindex: uint32(ifc.Index)}
		// Each call sets up and tears down a page pool, which costs
		// milliseconds: unpaced, send big chunks; paced, 64 frames.
		batch := uint64(1 << 16)
		if rate > 0 {
			batch = 64
		}
		start := time.Now()
		var done uint64
		for done < n {
			if err := ctx.Err(); err != nil {
				return err
			}
			k := min(batch, n-done)
			_, err := g.prog.Run(&ebpf.RunOptions{Data: f, Context: md, Repeat: uint32(k), Flags: 1 << 1})
			if err != nil {
				return fmt.Errorf("xdp_tx live run: %w", err)
			}
			done += k
			sent.Add(k)
			if rate > 0 {
				if ahead := time.Duration(float64(done)/rate*1e9) - time.Since(start); ahead > 0 {
					time.Sleep(ahead)
				}
			}
		}
		return nil
	})
}

func tierTable(c *floodConfig) (tiers.Table, error) { return tiers.Compile(c.policy()) }
