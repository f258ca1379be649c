// Package testenv holds what the tierlimit BPF and integration tests share:
// the root/BPF gate, frames crafted with gopacket, and network namespaces
// that a test creates and always removes. It is imported by tests only.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
)

// RequireEnv is the variable that turns a skip into a failure: .ci/run sets
// it, so that BPF tests can never silently skip in CI.
const RequireEnv = "TIERLIMIT_REQUIRE_BPF"

// Require skips tb unless the process can load BPF programs (root, a kernel
// with BPF), giving the reason. With TIERLIMIT_REQUIRE_BPF=1 it fails
// instead of skipping.
func Require(tb testing.TB) {
	tb.Helper()
	if reason := unavailable(); reason != "" {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("BPF tests required (%s=1) but cannot run: %s", RequireEnv, reason)
		}
		tb.Skipf("skipping BPF test: %s (run as root on Linux >= 5.12; set %s=1 to fail instead)", reason, RequireEnv)
	}
}

func unavailable() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return "remove memlock rlimit: " + err.Error()
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return "kernel lacks XDP support"
		}
		return "load a trivial XDP program: " + err.Error()
	}
	prog.Close()
	return ""
}

// BareProgram loads a program that returns action for every packet: the
// baseline of the benchmarks.
func BareProgram(tb testing.TB, action int32) *ebpf.Program {
	tb.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "bare",
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, action), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		tb.Fatalf("load bare program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// PinPath returns a fresh pin directory on /sys/fs/bpf for tb (not made
// yet: the agent makes it), and removes it in Cleanup, together with the
// file that each of extra names for it (the agent's lock file, say).
func PinPath(tb testing.TB, extra ...func(pin string) string) string {
	tb.Helper()
	pin := fmt.Sprintf("/sys/fs/bpf/tltest-%d-%d", os.Getpid(), time.Now().UnixNano())
	tb.Cleanup(func() {
		os.RemoveAll(pin)
		for _, f := range extra {
			os.Remove(f(pin))
		}
	})
	return pin
}
