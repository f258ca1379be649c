package main

// Pins that die with the agent (issue 26): the real binary in private
// mount namespaces (ip netns exec, unshare -m, a container's fresh /sys
// with the host's bpffs bind-mounted), stopped with SIGTERM; what the
// kernel has after the exit (netlink, on the test's own veth) must be what
// the agent said it would have.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// spawnCmd starts cmd, an agent under a wrapper (ip netns exec, unshare,
// sh) that execs it, logging into the agentProc's log. Cleanup kills it if
// it still runs.
func spawnCmd(t *testing.T, cmd *exec.Cmd) *agentProc {
	t.Helper()
	p := &agentProc{cmd: cmd, log: &testenv.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

// runRefused runs cmd to its end (at most 30 s) and returns its exit code
// and output.
func runRefused(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// stopSaid is what a stopped agent's log says the kernel keeps on iface:
// "attached" (stays attached and pinned), "detached", or "" for neither.
func stopSaid(log, iface string) string {
	attached := strings.Contains(log, `msg="limiter stays attached and pinned" iface=`+iface)
	detached := strings.Contains(log, "msg=detached iface="+iface) ||
		strings.Contains(log, `the limiter is detached as the agent exits" iface=`+iface)
	switch {
	case attached && !detached:
		return "attached"
	case detached && !attached:
		return "detached"
	}
	return ""
}

// checkStop stops a with SIGTERM (sent to pid, the agent's) and checks that
// the agent said want ("attached" or "detached") and that the kernel, after
// the exit, has what it said on p's collector veth.
func checkStop(t *testing.T, p *testenv.Pair, a *agentProc, pid int, want string) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %d: %v", pid, err)
	}
	select {
	case <-a.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("the agent did not exit on SIGTERM:\n%s", a.log)
	}
	said := stopSaid(a.log.String(), p.CollIf)
	if said != want {
		t.Fatalf("the agent's stop message says %q, want %q:\n%s", said, want, a.log)
	}
	// The link goes with the last reference to it: the agent's fd at exit,
	// or a private bpffs when its mount namespace is torn down after.
	var x testenv.Attached
	settled := waitFor(3*time.Second, func() bool {
		x = testenv.XDP(t, p.Coll, p.CollIf)
		return (x.ID != 0) == (said == "attached")
	})
	if !settled {
		t.Fatalf("the agent said %q on stopping, but after its exit the kernel shows XDP program %d (%s) on %s:\n%s",
			said, x.ID, x.Mode, p.CollIf, a.log)
	}
	if said == "attached" && x.Name != pin.ProgramName {
		t.Fatalf("program %d %q on %s after the exit, want tierlimit's", x.ID, x.Name, p.CollIf)
	}
}

// hostPinned checks that the host's mount namespace (the test's) sees the
// link of iface pinned under pin.
func hostPinned(t *testing.T, pinPath, iface string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pinPath, "links", pin.PinName(iface))); err != nil {
		t.Fatalf("the host does not see the pinned link: %v", err)
	}
}

func contains(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// TestPrivateBPFFSIPNetnsExec is issue 26 as reported: `ip netns exec`
// gives the agent a fresh /sys, where it finds no bpffs and would mount one
// that ends with it. The agent refuses to pin (exit 2, naming the fixes)
// and attaches nothing; with --no-pin it runs and detaches on SIGTERM.
// status and detach run the same way say where they looked while the
// pins are in the host's bpffs.
func TestPrivateBPFFSIPNetnsExec(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	pinPath := testPin(t, p)
	bin := cli(t)
	netnsExec := func(args ...string) *exec.Cmd {
		return exec.Command("ip", append([]string{"netns", "exec", p.Coll.Name, bin}, args...)...)
	}

	code, out := runRefused(t, netnsExec("run", "--iface", p.CollIf, "--pin-path", pinPath, "--metrics-addr", ""))
	if code != exitUsage {
		t.Fatalf("run under ip netns exec: exit %d, want %d (refused):\n%s", code, exitUsage, out)
	}
	contains(t, out, "refusing to pin", "the agent mounted it", "no mount of this bpffs instance is in PID 1's", "nsenter --net=/run/netns/NAME instead of ip netns exec",
		"mount the host's bpffs", "--no-pin")
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != 0 {
		t.Fatalf("refused, yet program %d is attached to %s", x.ID, p.CollIf)
	}
	if _, err := os.Stat(pinPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused, yet %s exists on the host: %v", pinPath, err)
	}

	t.Run("no-pin", func(t *testing.T) {
		a := spawnCmd(t, netnsExec("run", "--iface", p.CollIf, "--no-pin", "--metrics-addr", ""))
		if !a.waitLog("msg=started", 15*time.Second) {
			t.Fatalf("run --no-pin under ip netns exec did not start:\n%s", a.log)
		}
		checkStop(t, p, a, a.cmd.Process.Pid, "detached")
	})

	t.Run("status and detach", func(t *testing.T) {
		a := startRun(t, p.Coll, "--iface", p.CollIf, "--pin-path", pinPath, "--metrics-addr", "") // nsenter --net: the host's bpffs
		code, out := runRefused(t, netnsExec("status", "--pin-path", pinPath))
		if code != exitFailure {
			t.Fatalf("status under ip netns exec: exit %d:\n%s", code, out)
		}
		contains(t, out, "no pinned tierlimit state", "looked in /sys/fs/bpf, where no bpffs is mounted in this mount namespace (it is sysfs)",
			fmt.Sprintf("an agent (pid %d) holds this pin path", a.cmd.Process.Pid), "nsenter --mount --target")
		checkStop(t, p, a, a.cmd.Process.Pid, "attached")
		hostPinned(t, pinPath, p.CollIf)

		code, out = runRefused(t, netnsExec("detach", "--iface", p.CollIf, "--pin-path", pinPath))
		if code == 0 {
			t.Fatalf("detach under ip netns exec claims success:\n%s", out)
		}
		contains(t, out, "looked in /sys/fs/bpf, where no bpffs is mounted", "ip netns exec")
		if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID == 0 {
			t.Fatalf("detach under ip netns exec failed, yet the limiter is gone")
		}
	})
}

// unshareRun is `unshare -m --propagation private` running script in sh,
// inside p's collector network namespace. The script ends by exec'ing the
// agent, so the process's pid is the agent's.
func unshareRun(p *testenv.Pair, script string) *exec.Cmd {
	return exec.Command("unshare", "--mount", "--propagation", "private", "nsenter", "--net="+p.Coll.Path, "sh", "-c", script)
}

// TestPrivateBPFFSUnshare runs the agent under `unshare -m --propagation
// private`. A copy of the host's bpffs mount is the same bpffs instance:
// the agent pins, and the limiter outlives it. A bpffs mounted in the
// private namespace (by the agent, finding none, or by a wrapper) ends with
// it: refused. The host's bpffs unmounted while the agent runs leaves the
// agent the last mount of it: the agent says, on stopping, that the limiter
// goes, and the kernel agrees.
func TestPrivateBPFFSUnshare(t *testing.T) {
	testenv.Require(t)
	bin := cli(t)

	t.Run("host bpffs copied", func(t *testing.T) {
		p := testenv.NewPair(t)
		pinPath := testPin(t, p)
		a := spawnCmd(t, unshareRun(p, fmt.Sprintf("exec %s run --iface %s --pin-path %s --metrics-addr ''", bin, p.CollIf, pinPath)))
		if !a.waitLog("msg=started", 15*time.Second) {
			t.Fatalf("did not start:\n%s", a.log)
		}
		contains(t, a.log.String(), `msg="pins outlive the agent"`, "the same bpffs instance is mounted in PID 1's mount namespace")
		checkStop(t, p, a, a.cmd.Process.Pid, "attached")
		hostPinned(t, pinPath, p.CollIf)
	})

	t.Run("agent mounts its own", func(t *testing.T) {
		p := testenv.NewPair(t)
		pinPath := testPin(t, p)
		code, out := runRefused(t, unshareRun(p, fmt.Sprintf(`while mountpoint -q /sys/fs/bpf; do umount /sys/fs/bpf; done
exec %s run --iface %s --pin-path %s --metrics-addr ''`, bin, p.CollIf, pinPath)))
		if code != exitUsage {
			t.Fatalf("exit %d, want %d (refused):\n%s", code, exitUsage, out)
		}
		contains(t, out, "refusing to pin", "the agent mounted it, finding none at /sys/fs/bpf", "--no-pin")
		if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != 0 {
			t.Fatalf("refused, yet program %d is attached", x.ID)
		}
	})

	t.Run("wrapper mounts its own", func(t *testing.T) {
		p := testenv.NewPair(t)
		dir := t.TempDir()
		t.Cleanup(func() { os.Remove(pin.LockFile(filepath.Join(dir, "tl"))) })
		code, out := runRefused(t, unshareRun(p, fmt.Sprintf(`mount -t bpf bpf %[1]s
exec %[2]s run --iface %[3]s --pin-path %[1]s/tl --metrics-addr ''`, dir, bin, p.CollIf)))
		if code != exitUsage {
			t.Fatalf("exit %d, want %d (refused):\n%s", code, exitUsage, out)
		}
		contains(t, out, "refusing to pin", "no mount of this bpffs instance is in PID 1's (the host's) mount namespace")
		if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != 0 {
			t.Fatalf("refused, yet program %d is attached", x.ID)
		}
	})

	t.Run("host unmounts it meanwhile", func(t *testing.T) {
		p := testenv.NewPair(t)
		dir := t.TempDir()
		// A bpffs of the test's own, in the host's mount namespace,
		// private so that nothing else gets a copy.
		if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
			t.Fatalf("mount bpffs on %s: %v", dir, err)
		}
		mounted := true
		t.Cleanup(func() {
			if mounted {
				unix.Unmount(dir, unix.MNT_DETACH)
			}
		})
		if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
			t.Fatal(err)
		}
		// The case needs the test's own mounts to be PID 1's (the host's
		// init): in a chroot or container with a mount namespace of its
		// own (.ci/fresh-machine's), the agent rightly sees this bpffs as
		// private and refuses it, which the other cases test.
		if mi, err := os.ReadFile("/proc/1/mountinfo"); err == nil && !strings.Contains(string(mi), " "+dir+" ") {
			t.Skipf("the test's mounts are not in PID 1's mount namespace (%s is not in /proc/1/mountinfo): a chroot or container", dir)
		}
		pinPath := filepath.Join(dir, "tl")
		t.Cleanup(func() { os.Remove(pin.LockFile(pinPath)) })
		a := spawnCmd(t, unshareRun(p, fmt.Sprintf("exec %s run --iface %s --pin-path %s --metrics-addr ''", bin, p.CollIf, pinPath)))
		if !a.waitLog("msg=started", 15*time.Second) {
			t.Fatalf("did not start:\n%s", a.log)
		}
		hostPinned(t, pinPath, p.CollIf)
		if err := unix.Unmount(dir, 0); err != nil {
			t.Fatalf("unmount the host's copy: %v", err)
		}
		mounted = false
		checkStop(t, p, a, a.cmd.Process.Pid, "detached")
		contains(t, a.log.String(), "no mount of this bpffs instance is in PID 1's")
	})
}

// containerScript gives the agent what a container with the host's bpffs
// as a volume has (the DaemonSet's hostPath): a fresh /sys of the
// agent's network namespace, with the host's bpffs bind-mounted on
// /sys/fs/bpf, then execs the agent with args.
func containerScript(hold, bin string, args ...string) string {
	return fmt.Sprintf(`set -eu
mount --bind /sys/fs/bpf %[1]s
umount -l /sys
mount -t sysfs sysfs /sys
[ "$(stat -f -c %%T /sys/fs/bpf)" = sysfs ] || { echo "no fresh /sys"; exit 9; }
mount --bind %[1]s /sys/fs/bpf
umount %[1]s
exec %[2]s run %[3]s`, hold, bin, strings.Join(args, " "))
}

// TestHostBPFFSBindMounted: the host's bpffs bind-mounted into a private
// mount namespace with a fresh /sys, as the DaemonSet mounts it (and as
// systemd's PrivateMounts gives the unit a copy of it): the agent pins,
// and the limiter outlives it, verified from PID 1's mounts. In a PID
// namespace too, PID 1 is the container's init and the host's mounts
// cannot be seen: the agent trusts a bpffs it did not mount, and says the
// check was not possible.
func TestHostBPFFSBindMounted(t *testing.T) {
	testenv.Require(t)
	bin := cli(t)

	t.Run("mount namespace", func(t *testing.T) {
		p := testenv.NewPair(t)
		pinPath := testPin(t, p)
		script := containerScript(t.TempDir(), bin, "--iface", p.CollIf, "--pin-path", pinPath, "--metrics-addr", "''")
		a := spawnCmd(t, unshareRun(p, script))
		if !a.waitLog("msg=started", 15*time.Second) {
			t.Fatalf("did not start:\n%s", a.log)
		}
		contains(t, a.log.String(), `msg="pins outlive the agent"`, "the same bpffs instance is mounted in PID 1's mount namespace")
		checkStop(t, p, a, a.cmd.Process.Pid, "attached")
		hostPinned(t, pinPath, p.CollIf)
	})

	t.Run("mount and PID namespaces", func(t *testing.T) {
		p := testenv.NewPair(t)
		pinPath := testPin(t, p)
		script := containerScript(t.TempDir(), bin, "--iface", p.CollIf, "--pin-path", pinPath, "--metrics-addr", "''")
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--mount-proc",
			"nsenter", "--net="+p.Coll.Path, "sh", "-c", script)
		a := spawnCmd(t, cmd)
		if !a.waitLog("msg=started", 15*time.Second) {
			t.Fatalf("did not start:\n%s", a.log)
		}
		contains(t, a.log.String(), `msg="pins trusted to outlive the agent, unverified"`, "in a PID namespace (a container)")
		checkStop(t, p, a, childPid(t, cmd.Process.Pid), "attached")
		hostPinned(t, pinPath, p.CollIf)
	})
}

// childPid is the one child of pid (unshare --fork's: the agent).
func childPid(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatalf("children of %d: %v", pid, err)
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		t.Fatalf("children of %d: %q, want one", pid, f)
	}
	c, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}
