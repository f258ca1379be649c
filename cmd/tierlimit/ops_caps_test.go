package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestHardenedCapabilities (issue 11 C14): run, status and detach, the
// commands a hardened service uses, all work with the shipped unit's
// capabilities exactly (testenv.AsUnit) and without CAP_SYS_ADMIN; a
// second run (a restart) carries the source sketch (issue 42); detach
// recognises the agent's own program although its name cannot be read
// without CAP_SYS_ADMIN.
func TestHardenedCapabilities(t *testing.T) {
	documented(t, "../../README.md", "CAP_NET_ADMIN", "CAP_BPF", "CAP_PERFMON", "CAP_DAC_OVERRIDE", "CAP_SYS_ADMIN")
	documented(t, "../../docs/operations.md", "hardened service (CAP_NET_ADMIN, CAP_BPF, CAP_PERFMON, CAP_DAC_OVERRIDE, no CAP_SYS_ADMIN)")
	testenv.Require(t)
	hardenedCaps := strings.Join(testenv.UnitCaps(t), ",")
	p := testenv.NewPair(t)
	pinPath := testPin(t, p)
	bin := cli(t)
	mountBPFFS(t)
	hardened := func(ctx context.Context, args ...string) *exec.Cmd {
		return testenv.AsUnit(t, ctx, p.Coll, bin, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	run := func() string {
		t.Helper()
		var logs testenv.SyncBuffer
		runCmd := hardened(ctx, "run", "--iface", p.CollIf, "--pin-path", pinPath, "--metrics-addr", "")
		runCmd.Stderr = &logs
		if err := runCmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- runCmd.Wait() }()
		deadline := time.Now().Add(15 * time.Second)
		for !strings.Contains(logs.String(), "msg=started") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(logs.String(), "msg=started") {
			runCmd.Process.Kill()
			<-done
			t.Fatalf("run with %s did not start:\n%s", hardenedCaps, logs.String())
		}
		runCmd.Process.Signal(syscall.SIGTERM)
		if err := <-done; err != nil {
			t.Fatalf("run exited: %v\n%s", err, logs.String())
		}
		return logs.String()
	}
	run()
	// A restart adopts the source sketch from the globals pinned beside
	// the program (one map lookup, which CAP_BPF allows).
	if logs := run(); !strings.Contains(logs, "carried the source sketch") {
		t.Errorf("a restart with %s did not carry the source sketch:\n%s", hardenedCaps, logs)
	}
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.Name != pin.ProgramName {
		t.Fatalf("after run stopped: %+v, want tierlimit still attached", x)
	}
	out, err := hardened(ctx, "status", "--pin-path", pinPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), p.CollIf) {
		t.Errorf("status with %s: %v\n%s", hardenedCaps, err, out)
	}
	out, err = hardened(ctx, "detach", "--iface", p.CollIf, "--pin-path", pinPath).CombinedOutput()
	if err != nil {
		t.Fatalf("detach with %s: %v\n%s", hardenedCaps, err, out)
	}
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != 0 {
		t.Errorf("after detach: %+v attached", x)
	}
	if _, err := os.Stat(pinPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("detach left %s", pinPath)
	}
}

// TestSecondRunNoPin (issue 11 D): a second `run --no-pin` on an interface
// that another agent holds says so, and exits 1.
func TestSecondRunNoPin(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	startRun(t, p.Coll, "--iface", p.CollIf, "--no-pin", "--metrics-addr", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := p.Coll.Command(ctx, cli(t), "run", "--iface", p.CollIf, "--no-pin", "--metrics-addr", "")
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("second run: %v, want exit 1\n%s", err, stderr.String())
	}
	oneLine(t, stderr.String(), p.CollIf, "another agent")
	if strings.Contains(stderr.String(), "file exists") {
		t.Errorf("second run reports the errno, not the cause: %s", stderr.String())
	}
}

// TestStatusInterfaceGone (issue 10 §8): status names a deleted interface
// as gone and says what its pinned link still holds and how to remove it,
// instead of "(ifindex 0): unknown XDP".
func TestStatusInterfaceGone(t *testing.T) {
	st := agent.Status{Pinned: pin.Pinned{PinPath: "/sys/fs/bpf/t1", Links: []pin.PinnedLink{{Iface: "hrc0", Mode: "none", LinkID: 7, ProgramID: 42, Gone: true}}}}
	st.Policy.DropRatios = []float64{0}
	var out bytes.Buffer
	if err := writeStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	want := "hrc0: interface gone; pinned link 7 still holds program 42 and the maps (tierlimit detach --iface hrc0 --pin-path /sys/fs/bpf/t1 removes it)"
	if !strings.Contains(out.String(), want) || strings.Contains(out.String(), "ifindex 0") {
		t.Errorf("status with a deleted interface:\n%s\nwant %q", out.String(), want)
	}
	var js bytes.Buffer
	if err := writeStatusJSON(&js, st, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"interface_gone": true`) {
		t.Errorf("status --json lacks interface_gone:\n%s", js.String())
	}
}

// TestExplainWordsAgentErrors: the agent's typed errors name no flags;
// cmd adds the flag or command to use, and keeps the error in the chain.
func TestExplainWordsAgentErrors(t *testing.T) {
	for _, c := range []struct {
		err      error
		sentinel error
		want     string
	}{
		{&pin.ForeignProgramError{Iface: "eth1", Program: `program id 9, name "x"`}, pin.ErrForeignProgram, "(pass --replace to replace it)"},
		{&pin.BusyError{Iface: "eth1", Program: "program id 9"}, pin.ErrInterfaceBusy, "held by another agent"},
		{&pin.AgentRunningError{Pin: "/sys/fs/bpf/t", Pid: ""}, pin.ErrAgentRunning, "(/sys/fs/bpf/t, pid unknown): stop it first"},
		{&agent.IncompatiblePinError{Pin: "/sys/fs/bpf/t", Err: errors.New("window: bad")}, agent.ErrIncompatiblePin, "remove them with tierlimit detach --iface eth1 --pin-path /sys/fs/bpf/t"},
		{attach.ErrNativeRefused, attach.ErrNativeRefused, "try --xdp-mode generic"},
		{attach.ErrDuplicateInterface, attach.ErrDuplicateInterface, "--iface: interface given twice"},
	} {
		got := explainAgent(c.err, "/sys/fs/bpf/t", []string{"eth1"})
		if !errors.Is(got, c.sentinel) || !strings.Contains(got.Error(), c.want) {
			t.Errorf("explain(%v) = %v, want %q and the sentinel kept", c.err, got, c.want)
		}
		if strings.Contains(c.err.Error(), "--") {
			t.Errorf("agent error %q names a flag", c.err)
		}
	}
}

// TestRunPinDirRemoved (issue 11 A1, as the operator saw it): `rm -rf` of
// the pin directory under `tierlimit run`, then SIGTERM. The agent notices
// within its 2 s check, pins everything again, and its stop message is
// true: the limiter stays attached and pinned, and status reads it.
func TestRunPinDirRemoved(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testPin(t, p)
	a := startRun(t, p.Coll, "--iface", p.CollIf, "--pin-path", pinPath, "--metrics-addr", "")
	id := testenv.XDP(t, p.Coll, p.CollIf).ID
	if err := os.RemoveAll(pinPath); err != nil {
		t.Fatal(err)
	}
	if !a.waitLog("pinned state restored", 10*time.Second) {
		t.Fatalf("no re-pin within 10s:\n%s", a.log)
	}
	// A check that raced rm -rf may have restored only part; the next
	// one completes it.
	complete := func() bool {
		maps, _ := os.ReadDir(pinPath + "/maps")
		_, e1 := os.Stat(pinPath + "/links/" + p.CollIf)
		_, e2 := os.Stat(pinPath + "/program")
		return len(maps) == 10 && e1 == nil && e2 == nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for !complete() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	a.stop(t, syscall.SIGTERM)
	if !strings.Contains(a.log.String(), "pinned state removed while the agent runs") || !strings.Contains(a.log.String(), "limiter stays attached and pinned") {
		t.Errorf("logs:\n%s", a.log)
	}
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != id {
		t.Fatalf("after stop: %+v, want program %d still attached", x, id)
	}
	out, err := p.Coll.Command(context.Background(), cli(t), "status", "--pin-path", pinPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), p.CollIf) {
		t.Fatalf("status after re-pinning: %v\n%s", err, out)
	}
}
