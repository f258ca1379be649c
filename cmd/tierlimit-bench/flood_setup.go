package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/tiers"
)

// The flood sandbox: namespaces, veths, the method under test and its undo list.

// bench is one sandbox: a pair of namespaces, the method's limiter, the
// collector process and what is needed to flood it. close undoes it all.
type bench struct {
	cfg   *floodConfig
	m     method
	pair  *sandbox.Pair
	lim   *bpf.Limiter
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
	case methodXDP, methodXDPRecord:
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

// attachXDP runs tierlimit's agent, unpinned, with the policy on the
// collector's veth in native mode (veth's own XDP), inside its namespace:
// the bench attaches as any user does. Closing the agent detaches it.
// For methodXDPRecord the policy samples shed packets at the default cap
// into pcapng files under a directory of its own, which the agent's
// recorder writes as it does in service.
func (b *bench) attachXDP() error {
	p := b.cfg.policy()
	var dir string
	if b.m == methodXDPRecord {
		var err error
		if dir, err = os.MkdirTemp(b.cfg.tmp, "tierlimit-bench-record-"); err != nil {
			return err
		}
		b.undo = append(b.undo, func() {
			files, _ := filepath.Glob(filepath.Join(dir, "*.pcapng"))
			var bytes int64
			for _, f := range files {
				if fi, err := os.Stat(f); err == nil {
					bytes += fi.Size()
				}
			}
			fmt.Fprintf(b.cfg.log, "shed record: %d bytes of samples in %d pcapng files\n", bytes, len(files))
			os.RemoveAll(dir)
		})
		p.Record = tiers.Record{Samples: tiers.DefaultRecordSamples, Snaplen: tiers.RecordSnapMax, Dir: dir, MaxBytes: 16 << 20}
	}
	return b.pair.Coll.Do(func() error {
		a, err := agent.New(agent.Config{Interfaces: []string{b.pair.CollIf}, XDPMode: attach.XDPNative}, p)
		if err != nil {
			return fmt.Errorf("agent on %s: %w", b.pair.CollIf, err)
		}
		b.lim = a.Limiter()
		ctx, cancel := context.WithCancel(context.Background())
		b.undo = append(b.undo, func() {
			cancel()
			if err := a.Close(); err != nil {
				fmt.Fprintln(b.cfg.log, "cleanup:", err)
			}
		})
		if dir != "" {
			if _, err := a.StartRecord(ctx, p, ""); err != nil {
				return fmt.Errorf("shed record: %w", err)
			}
		}
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
