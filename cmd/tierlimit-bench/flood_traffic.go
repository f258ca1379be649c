package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/sandbox"
)

// Traffic sources of the flood: the frame, trafgen, and the XDP_TX generator.

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
