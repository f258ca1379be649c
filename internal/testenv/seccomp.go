package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// BPFProgLoad is bpf(2)'s BPF_PROG_LOAD command (include/uapi/linux/bpf.h).
const BPFProgLoad = 5

var seccompExec struct {
	once sync.Once
	path string
	err  error
}

// DenyBPFCommand returns the arguments that, put before a command line,
// run it under a seccomp filter that refuses bpf(2) command cmd with EPERM
// and allows everything else (internal/testenv/seccompexec, built once):
// a host whose seccomp profile or BPF LSM refuses that command alone.
func DenyBPFCommand(tb testing.TB, cmd int) []string {
	tb.Helper()
	return DenyBPFCommandErrno(tb, cmd, syscall.EPERM)
}

// DenyBPFCommandErrno is DenyBPFCommand with the errno the filter returns:
// EACCES is what SELinux and other LSMs give.
func DenyBPFCommandErrno(tb testing.TB, cmd int, errno syscall.Errno) []string {
	tb.Helper()
	s := &seccompExec
	s.once.Do(func() {
		dir, err := os.MkdirTemp("", "tierlimit-seccompexec-")
		if err != nil {
			s.err = err
			return
		}
		s.path = filepath.Join(dir, "seccompexec")
		b := exec.Command("go", "build", "-o", s.path, "./internal/testenv/seccompexec")
		b.Dir = repoRoot()
		if out, err := b.CombinedOutput(); err != nil {
			s.err = &exec.Error{Name: "go build seccompexec", Err: errorString(string(out))}
		}
	})
	if s.err != nil {
		tb.Fatal(s.err)
	}
	return []string{s.path, strconv.Itoa(cmd) + ":" + strconv.Itoa(int(errno))}
}

type errorString string

func (e errorString) Error() string { return string(e) }
