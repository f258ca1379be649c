package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestClassifyBPFError: EPERM from bpf(2) with the capabilities granted is
// worded as the filter it is (seccomp, or an LSM without one), naming the
// fix and saying it is not memlock; other errors stay as they are.
func TestClassifyBPFError(t *testing.T) {
	eperm := fmt.Errorf("map create: %w", unix.EPERM)
	for _, c := range []struct {
		seccomp int
		want    []string
	}{
		{2, []string{"seccomp filter is active", "seccompProfile", "seccomp=unconfined", "not the memlock limit"}},
		{0, []string{"LSM", "not the memlock limit"}},
		{1, []string{"strict seccomp"}},
		{-1, []string{"seccomp filter or an LSM"}},
	} {
		err := classifyBPFError(eperm, c.seccomp)
		var d *BPFDeniedError
		if !errors.As(err, &d) || !errors.Is(err, ErrBPFDenied) || !errors.Is(err, unix.EPERM) {
			t.Errorf("seccomp %d: %v, want a *BPFDeniedError wrapping EPERM", c.seccomp, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("seccomp %d: %q lacks %q", c.seccomp, err, w)
			}
		}
	}
	if err := classifyBPFError(fmt.Errorf("x: %w", unix.EINVAL), 2); errors.Is(err, ErrBPFDenied) || !errors.Is(err, unix.EINVAL) {
		t.Errorf("EINVAL classified as %v", err)
	}
	// EACCES (issue 43 B62): SELinux's refusal, named as an LSM's.
	eacces := classifyBPFError(&probeDenied{Cmd: "BPF_PROG_LOAD", Errno: unix.EACCES}, 0)
	want := "the kernel refused to load a BPF program: an LSM such as SELinux denied it (EACCES)"
	if !errors.Is(eacces, ErrBPFDenied) || !errors.Is(eacces, unix.EACCES) || !strings.Contains(eacces.Error(), want) {
		t.Errorf("EACCES classified as %v, want %q", eacces, want)
	}
	if m := seccompMode(); m < 0 || m > 2 {
		t.Errorf("seccompMode() = %d on Linux", m)
	}
}
