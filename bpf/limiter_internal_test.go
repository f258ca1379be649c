package bpf

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
)

// TestTailCallRefused: Load retries with the judgement called on the
// verifier's refusal of a tail call beside BPF-to-BPF calls (the lines of
// kernel/bpf/verifier.c before Linux 6.0 off x86-64, and without a JIT),
// wrapped as cilium/ebpf wraps it, and on no other error.
func TestTailCallRefused(t *testing.T) {
	verr := func(lines ...string) error {
		return fmt.Errorf("program tierlimit: %w", &ebpf.VerifierError{Cause: errors.New("invalid argument"), Log: lines})
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{verr("0: R1=ctx() R10=fp0", "123: (85) call bpf_tail_call#12", "tail_calls are not allowed in programs with bpf-to-bpf calls"), true},
		{verr("tail_calls are not allowed in non-JITed programs with bpf-to-bpf calls", "processed 1000 insns"), true},
		{verr("R2 invalid mem access 'scalar'"), false},
		{errors.New("tail_calls are not allowed"), false}, // not the verifier's
		{nil, false},
	} {
		if got := tailCallRefused(c.err); got != c.want {
			t.Errorf("tailCallRefused(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
