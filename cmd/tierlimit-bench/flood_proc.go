package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit/internal/sandbox"
)

// Accounting from /proc and the collector process: CPU time, socket drops, counts.

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
