package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAsUnit: a process started with AsUnit has exactly the unit's
// capabilities in every set that counts (effective, permitted, bounding,
// ambient), not root's.
func TestAsUnit(t *testing.T) {
	Require(t)
	caps := UnitCaps(t)
	if len(caps) == 0 {
		t.Fatal("no capabilities in the unit")
	}
	bits := map[string]int{"net_admin": unix.CAP_NET_ADMIN, "bpf": unix.CAP_BPF, "perfmon": unix.CAP_PERFMON,
		"sys_admin": unix.CAP_SYS_ADMIN, "dac_override": unix.CAP_DAC_OVERRIDE, "net_raw": unix.CAP_NET_RAW}
	var want uint64
	for _, c := range caps {
		b, ok := bits[c]
		if !ok {
			t.Fatalf("capability %q: add it to this test's table", c)
		}
		want |= 1 << b
	}
	out, err := AsUnit(t, context.Background(), NewNS(t), "cat", "/proc/self/status").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, set := range []string{"CapEff", "CapPrm", "CapBnd", "CapAmb"} {
		var got uint64
		for _, l := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(l, set+":"); ok {
				fmt.Sscanf(strings.TrimSpace(v), "%x", &got)
			}
		}
		if got != want {
			t.Errorf("%s = %#x, want %#x (%v)", set, got, want, caps)
		}
	}
}
