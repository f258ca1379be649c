package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// ErrBPFDenied is returned by New when the kernel refuses bpf(2) itself
// although the agent holds CAP_BPF (*BPFDeniedError).
var ErrBPFDenied = errors.New("bpf(2) denied although CAP_BPF is granted")

// BPFDeniedError says that bpf(2) failed with EPERM or EACCES while the
// capability check passed: what refuses it is a seccomp filter (a container
// runtime's default profile: containerd before 1.7, moby, moby#42601) or an
// LSM (SELinux and other LSMs return EACCES), not the memlock limit or the
// verifier that the error of the later load would name.
type BPFDeniedError struct {
	Err error
	// Cmd is the refused bpf(2) command, "BPF_PROG_LOAD" or
	// "BPF_MAP_CREATE"; empty if unknown.
	Cmd string
	// Seccomp is /proc/self/status's Seccomp: 0 none, 1 strict, 2 a
	// filter; -1 unknown.
	Seccomp int
}

func (e *BPFDeniedError) Error() string {
	if errors.Is(e.Err, unix.EACCES) {
		what := "use bpf(2)"
		switch e.Cmd {
		case "BPF_PROG_LOAD":
			what = "load a BPF program"
		case "BPF_MAP_CREATE":
			what = "create a BPF map"
		}
		msg := fmt.Sprintf("%v: the kernel refused to %s: an LSM such as SELinux denied it (EACCES)", ErrBPFDenied, what)
		if e.Seccomp == 2 {
			msg += ", or the active seccomp filter (Seccomp: 2 in /proc/self/status) returns EACCES for bpf"
		}
		return msg + "; allow bpf for the agent's domain (SELinux: the bpf class's prog_load, map_create, prog_run, map_read and map_write permissions; see the audit log's AVC denial). This is not the verifier nor the memlock limit"
	}
	why := "no seccomp filter is active, so an LSM (SELinux, AppArmor, a BPF LSM) refuses it: allow bpf for the agent's domain"
	switch e.Seccomp {
	case 2:
		why = "a seccomp filter is active (Seccomp: 2 in /proc/self/status) and denies the bpf syscall: " +
			"run the agent with a seccomp profile that allows bpf (Kubernetes: securityContext.seccompProfile.type: Unconfined, " +
			"or a Localhost profile that adds bpf; Docker: --security-opt seccomp=unconfined or a profile with bpf; systemd: drop bpf from SystemCallFilter)"
	case 1:
		why = "the process runs under strict seccomp, which allows no bpf"
	case -1:
		why = "a seccomp filter or an LSM refuses it (the seccomp mode could not be read)"
	}
	return fmt.Sprintf("%v: %v; %s. This is not the memlock limit", ErrBPFDenied, e.Err, why)
}

func (e *BPFDeniedError) Unwrap() []error { return []error{ErrBPFDenied, e.Err} }

// classifyBPFError words err, from the first bpf(2) call of an agent whose
// capability check passed: EPERM or EACCES there is a filter or an LSM,
// not a capability.
func classifyBPFError(err error, seccomp int) error {
	if isDenied(err) {
		d := &BPFDeniedError{Err: err, Seccomp: seccomp}
		var pd *probeDenied
		if errors.As(err, &pd) {
			d.Cmd = pd.Cmd
		}
		return d
	}
	return fmt.Errorf("bpf(2): %w", err)
}

// isDenied: EPERM (a seccomp filter, a capability) or EACCES (an LSM; the
// probe's program is one the verifier accepts, so not the verifier).
func isDenied(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)
}

// probeDenied is probeBPF's refusal: the command and the bare errno.
type probeDenied struct {
	Cmd   string
	Errno unix.Errno
}

func (e *probeDenied) Error() string {
	what := ""
	if e.Cmd == "BPF_PROG_LOAD" {
		what = " of an XDP program"
	}
	return fmt.Sprintf("%s%s: %v", e.Cmd, what, e.Errno)
}

func (e *probeDenied) Unwrap() error { return e.Errno }

// deniedErrno is the errno of a refusal, 0 for any other error.
func deniedErrno(err error) unix.Errno {
	for _, e := range []unix.Errno{unix.EPERM, unix.EACCES} {
		if errors.Is(err, e) {
			return e
		}
	}
	return 0
}

// probeBPF makes the smallest bpf(2) calls the agent needs: creating a
// one-entry array map (BPF_MAP_CREATE), then loading an XDP program that
// passes every packet (BPF_PROG_LOAD): a seccomp filter or a BPF LSM may
// refuse the load alone. A refusal names the command with the bare errno:
// the library's own wording of EPERM at a load blames MEMLOCK, which
// Linux >= 5.11 no longer charges.
func probeBPF() error {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if e := deniedErrno(err); e != 0 {
		return &probeDenied{Cmd: "BPF_MAP_CREATE", Errno: e}
	} else if err != nil {
		return err
	}
	m.Close()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}, // XDP_PASS
		License:      "GPL",
	})
	if e := deniedErrno(err); e != 0 {
		return &probeDenied{Cmd: "BPF_PROG_LOAD", Errno: e}
	} else if err != nil {
		return err
	}
	return prog.Close()
}

// seccompMode reads the Seccomp field of /proc/self/status; -1 unknown.
func seccompMode() int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Seccomp:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	return -1
}
