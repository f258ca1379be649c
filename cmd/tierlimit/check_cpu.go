package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/tierlimit/tierlimit/internal/mitigation"
)

// hostRoot is the root printCPUCheck reads the CPU's vulnerability report
// under: "/" but in tests.
var hostRoot = "/"

// printCPUCheck prints the CPU mitigations that cost the program per call
// and return (internal/mitigation: spec_rstack_overflow, retbleed,
// spectre_v2), and what that means for one core's rate, from the report
// under root. Issue 42: on a CPU with SRSO's Safe RET every return from
// a subprogram or helper goes through a thunk built to mispredict.
func printCPUCheck(out io.Writer, root string) {
	r, err := mitigation.Read(root)
	if errors.Is(err, mitigation.ErrNoReport) {
		fmt.Fprintf(out, "\ncpu mitigations: not reported by this kernel (no /%s)\n", mitigation.Dir)
		return
	}
	if err != nil {
		fmt.Fprintf(out, "\ncpu mitigations: cannot read them: %v\n", err)
		return
	}
	fmt.Fprintf(out, "\ncpu mitigations: %s\n", r.Summary())
	if len(r.CallCosts()) > 0 {
		fmt.Fprintln(out, "  the program's subprogram and helper calls cost more on this CPU: one core judges fewer packets per second (docs/operations.md, \"Packets per core\")")
	}
}
