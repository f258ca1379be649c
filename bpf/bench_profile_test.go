package bpf_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	. "github.com/tierlimit/tierlimit/internal/testenv"
)

// profileLog starts the line BenchmarkPeers logs about bpftool's profile,
// which tierlimit-bench's page quotes: the reason when it was skipped.
const profileLog = "bpftool prog profile: "

// profileSeconds is how long bpftool profiles each path.
const profileSeconds = 2

// profiled are the paths BenchmarkPeers profiles: tierlimit's selected ones.
var profiled = []string{"smooth-pass", "ordinal-pass", "drop", "budgets-pass"}

// profileEntries runs `bpftool prog profile` (cycles, instructions,
// itlb_misses) on each of es named in profiled (after their sampled
// profile by source line, sampleEntries), pinned in a bpffs
// directory of its own, while BPF_PROG_TEST_RUN drives it on its frame,
// and reports <name>-cycles, <name>-insns and <name>-itlb per run. When
// the host has no hardware PMU (a VM that exposes none) or bpftool cannot
// profile, it logs why (profileLog) and reports nothing.
func profileEntries(b *testing.B, es []peerEntry) {
	b.Helper()
	sampleEntries(b, es)
	if reason := pmuMissing(); reason != "" {
		b.Logf("%sskipped: %s", profileLog, reason)
		return
	}
	pin := PinPath(b)
	if err := os.MkdirAll(pin, 0o700); err != nil {
		b.Fatal(err)
	}
	for _, e := range es {
		if !slices.Contains(profiled, e.name) {
			continue
		}
		path := filepath.Join(pin, e.name)
		if err := e.prog.Pin(path); err != nil {
			b.Fatal(err)
		}
		out, err := profileOne(e, path)
		if err != nil {
			b.Logf("%sskipped: %v", profileLog, err)
			return
		}
		runs := profileCount(out, "run_cnt")
		if runs == 0 {
			b.Logf("%sskipped: it counted no run of %s: %s", profileLog, e.name, out)
			return
		}
		for _, c := range []struct{ event, unit string }{{"cycles", "cycles"}, {"instructions", "insns"}, {"itlb_misses", "itlb"}} {
			b.ReportMetric(profileCount(out, c.event)/runs, e.name+"-"+c.unit)
		}
	}
	b.Logf("%sran for %d s on each of %v", profileLog, profileSeconds, profiled)
}

// profileOne runs bpftool on the program pinned at path while test runs
// drive it, and returns bpftool's output.
func profileOne(e peerEntry, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), (profileSeconds+10)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bpftool", "prog", "profile", "pinned", path,
		"duration", strconv.Itoa(profileSeconds), "cycles", "instructions", "itlb_misses")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start bpftool: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case err := <-done:
			if err != nil || bytes.Contains(out.Bytes(), []byte("not supported")) {
				return nil, fmt.Errorf("bpftool prog profile %s: %v: %s", e.name, err, bytes.TrimSpace(out.Bytes()))
			}
			return out.Bytes(), nil
		default:
			if _, err := runExact(e.prog, e.frame, 1<<16); err != nil {
				return nil, err
			}
		}
	}
}

// profileCount is the count bpftool printed before event in out, 0 when
// it printed none.
func profileCount(out []byte, event string) float64 {
	m := regexp.MustCompile(`(?m)^\s*(\d+)\s+` + regexp.QuoteMeta(event) + `\b`).FindSubmatch(out)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// pmuMissing says why the host cannot count CPU cycles for a program, or
// "" when it can: perf_event_open of the hardware cycle counter on this
// thread, as bpftool's profile opens it on every CPU.
func pmuMissing() string {
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_HARDWARE, Config: unix.PERF_COUNT_HW_CPU_CYCLES, Bits: unix.PerfBitDisabled}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		why := fmt.Sprintf("no hardware PMU on this host (perf_event_open of the cycle counter: %v", err)
		if _, serr := os.Stat("/sys/bus/event_source/devices/cpu"); serr != nil {
			why += "; /sys/bus/event_source/devices has no cpu: a VM that exposes no PMU"
		}
		return why + ")"
	}
	unix.Close(fd)
	return ""
}
