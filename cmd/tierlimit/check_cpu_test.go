package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/internal/mitigation"
)

// TestCheckCPU checks check's cpu mitigations line on fixture reports: a
// host with SRSO's Safe RET (issue 42's), one with none of the costly
// mitigations, and one whose kernel reports nothing.
func TestCheckCPU(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  []string
		not   string
	}{
		{"safe RET", map[string]string{"spec_rstack_overflow": "Mitigation: Safe RET", "retbleed": "Not affected", "spectre_v2": "Mitigation: Enhanced / Automatic IBRS"},
			[]string{`cpu mitigations: spec_rstack_overflow "Mitigation: Safe RET": every return pays srso_return_thunk (Safe RET)`, "one core judges fewer packets per second"}, ""},
		{"eIBRS", map[string]string{"spec_rstack_overflow": "Not affected", "retbleed": "Mitigation: Enhanced IBRS", "spectre_v2": "Mitigation: Enhanced / Automatic IBRS"},
			[]string{"cpu mitigations: none that makes a BPF call or return pay a thunk (spec_rstack_overflow: Not affected; retbleed: Mitigation: Enhanced IBRS; spectre_v2: Mitigation: Enhanced / Automatic IBRS)"}, "fewer packets"},
		{"no report", nil, []string{"cpu mitigations: not reported by this kernel (no /sys/devices/system/cpu/vulnerabilities)"}, "fewer packets"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			if c.files != nil {
				dir := filepath.Join(root, mitigation.Dir)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for n, s := range c.files {
					if err := os.WriteFile(filepath.Join(dir, n), []byte(s+"\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			var out bytes.Buffer
			printCPUCheck(&out, root)
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if c.not != "" && strings.Contains(out.String(), c.not) {
				t.Errorf("output has %q:\n%s", c.not, out.String())
			}
		})
	}
	// check itself ends with the line, from this host's report.
	code, out, errs := runCmd(t, "check")
	if code != 0 || !strings.Contains(out, "\ncpu mitigations: ") {
		t.Fatalf("check: exit %d, no cpu mitigations line:\n%s\n%s", code, out, errs)
	}
}
