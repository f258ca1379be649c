// Command seccompexec runs a program under a seccomp filter that refuses
// one bpf(2) command with EPERM (or the errno after the colon: 13 is
// EACCES, what SELinux returns) and allows every other system call: what a
// seccomp profile or a BPF LSM that denies only BPF_PROG_LOAD does. Tests
// use it (testenv.DenyBPFCommand); it is no part of tierlimit.
//
//	seccompexec BPF_CMD[:ERRNO] PROGRAM [ARG...]
package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	retAllow = 0x7fff0000 // SECCOMP_RET_ALLOW
	retErrno = 0x00050000 // SECCOMP_RET_ERRNO
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: seccompexec BPF_CMD PROGRAM [ARG...]")
		os.Exit(2)
	}
	cmdArg, errnoArg, _ := strings.Cut(os.Args[1], ":")
	errno := uint64(unix.EPERM)
	cmd, err := strconv.ParseUint(cmdArg, 10, 32)
	if err == nil && errnoArg != "" {
		errno, err = strconv.ParseUint(errnoArg, 10, 16)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "seccompexec: BPF_CMD:", err)
		os.Exit(2)
	}
	path, err := exec.LookPath(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "seccompexec:", err)
		os.Exit(2)
	}
	arch := map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}[runtime.GOARCH]
	if arch == 0 {
		fmt.Fprintln(os.Stderr, "seccompexec: unsupported architecture", runtime.GOARCH)
		os.Exit(2)
	}
	// struct seccomp_data: nr (0), arch (4), ip (8), args (16, 8 each).
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 5, K: arch},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: unix.SYS_BPF},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 16}, // args[0], low word (little endian)
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: uint32(cmd)},
		{Code: unix.BPF_RET | unix.BPF_K, K: retErrno | uint32(errno)},
		{Code: unix.BPF_RET | unix.BPF_K, K: retAllow},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	// The filter is the calling thread's, which execve then keeps.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "seccompexec: no_new_privs:", err)
		os.Exit(1)
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); e != 0 {
		fmt.Fprintln(os.Stderr, "seccompexec: seccomp:", e)
		os.Exit(1)
	}
	err = syscall.Exec(path, os.Args[2:], os.Environ())
	fmt.Fprintln(os.Stderr, "seccompexec: exec:", err)
	os.Exit(1)
}
