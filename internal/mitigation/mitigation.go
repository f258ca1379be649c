// Package mitigation reads the kernel's CPU vulnerability report
// (/sys/devices/system/cpu/vulnerabilities, Documentation/ABI/testing/
// sysfs-devices-system-cpu) and says which mitigations make every call
// and return of JIT-compiled BPF code pay a thunk: what costs tierlimit's
// program per subprogram and helper call on a CPU (issue 42). It needs
// Linux >= 4.15 (the directory); on older kernels Read returns
// ErrNoReport.
package mitigation

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Dir is the report's directory under the root.
const Dir = "sys/devices/system/cpu/vulnerabilities"

// ErrNoReport is Read's error when the root has no report directory.
var ErrNoReport = errors.New("no CPU vulnerability report")

// Entry is one file of the report: its name and its one line.
type Entry struct {
	Name, Status string
}

// Report is every entry of the report, sorted by name.
type Report []Entry

// Read reads the report under root ("/" on a host; a test passes a
// directory of fixture files). Returns ErrNoReport when root has no
// report directory, and the error of a file it cannot read.
func Read(root string) (Report, error) {
	dir := filepath.Join(root, Dir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoReport)
	}
	if err != nil {
		return nil, err
	}
	var r Report
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		r = append(r, Entry{Name: e.Name(), Status: strings.TrimSpace(string(b))})
	}
	slices.SortFunc(r, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return r, nil
}

// Status is the status of the entry named name, "" when there is none.
func (r Report) Status(name string) string {
	for _, e := range r {
		if e.Name == name {
			return e.Status
		}
	}
	return ""
}

// Cost is one mitigation in force that makes BPF calls or returns pay: the
// entry that reports it and what it costs the program.
type Cost struct {
	Entry
	// Per is what pays: "return" (every return: a BPF-to-BPF subprogram's
	// and a helper's that is not inlined), "call" (every call) or
	// "indirect call" (tail calls and bpf_loop's callback).
	Per string
	// Why names the thunk, as the kernel's x86 BPF JIT emits it.
	Why string
}

// CallCosts are the mitigations of r that make calls or returns of
// JIT-compiled BPF code pay a thunk, from the three entries that can
// (arch/x86/net/bpf_jit_comp.c emits every ret through x86_return_thunk
// when the kernel uses one, and indirect jumps through retpolines):
//
//   - spec_rstack_overflow "Mitigation: Safe RET" (AMD Zen 1-4, SRSO):
//     every return goes through srso_return_thunk, built to mispredict;
//   - retbleed "Mitigation: untrained return thunk" (AMD Zen 1/2) or
//     "Mitigation: Stuffing" (Intel, call depth tracking): every return,
//     and with stuffing every call, pays its accounting;
//   - spectre_v2 "Mitigation: Retpolines": every indirect call or jump
//     (a tail call, bpf_loop's callback) goes through a retpoline.
//
// "Not affected", "Enhanced IBRS", "IBPB" and the rest cost the program
// nothing per call: they act at entry, exit or context switch.
func (r Report) CallCosts() []Cost {
	var cs []Cost
	srso := r.Status("spec_rstack_overflow")
	if strings.Contains(srso, "Safe RET") {
		cs = append(cs, Cost{Entry{"spec_rstack_overflow", srso}, "return", "srso_return_thunk (Safe RET)"})
	}
	rb := strings.ToLower(r.Status("retbleed"))
	switch {
	case strings.Contains(rb, "untrained return thunk"):
		cs = append(cs, Cost{Entry{"retbleed", r.Status("retbleed")}, "return", "retbleed_return_thunk (untrained return thunk)"})
	case strings.Contains(rb, "stuffing"):
		cs = append(cs, Cost{Entry{"retbleed", r.Status("retbleed")}, "call", "call depth accounting (RSB stuffing)"})
	}
	if v2 := r.Status("spectre_v2"); strings.Contains(strings.ToLower(v2), "retpoline") {
		cs = append(cs, Cost{Entry{"spectre_v2", v2}, "indirect call", "retpoline"})
	}
	return cs
}

// Summary is one line for a person: the costly mitigations, or that none
// of the three entries costs the program per call.
func (r Report) Summary() string {
	cs := r.CallCosts()
	if len(cs) == 0 {
		return fmt.Sprintf("none that makes a BPF call or return pay a thunk (spec_rstack_overflow: %s; retbleed: %s; spectre_v2: %s)",
			orUnknown(r.Status("spec_rstack_overflow")), orUnknown(r.Status("retbleed")), orUnknown(r.Status("spectre_v2")))
	}
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s %q: every %s pays %s", c.Name, c.Status, c.Per, c.Why))
	}
	return strings.Join(parts, "; ")
}

func orUnknown(s string) string {
	if s == "" {
		return "not reported"
	}
	return s
}
