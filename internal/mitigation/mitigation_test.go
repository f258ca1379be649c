package mitigation

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture writes a report of files under a temporary root.
func fixture(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, Dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCallCosts(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  []string // name/per of each cost, in order
		in    string   // a part of Summary
	}{
		{"AMD EPYC Zen 3, SRSO Safe RET (issue 42's host)", map[string]string{
			"spec_rstack_overflow": "Mitigation: Safe RET",
			"retbleed":             "Not affected",
			"spectre_v2":           "Mitigation: Retpolines; IBPB: conditional; IBRS_FW; STIBP: disabled; RSB filling; PBRSB-eIBRS: Not affected; BHI: Not affected",
			"meltdown":             "Not affected",
		}, []string{"spec_rstack_overflow/return", "spectre_v2/indirect call"}, `spec_rstack_overflow "Mitigation: Safe RET": every return pays srso_return_thunk`},
		{"Intel with eIBRS (this CI host)", map[string]string{
			"spec_rstack_overflow": "Not affected",
			"retbleed":             "Mitigation: Enhanced IBRS",
			"spectre_v2":           "Mitigation: Enhanced / Automatic IBRS; IBPB: conditional; PBRSB-eIBRS: SW sequence; BHI: Vulnerable",
		}, nil, "none that makes a BPF call or return pay a thunk (spec_rstack_overflow: Not affected; retbleed: Mitigation: Enhanced IBRS"},
		{"AMD Zen 2, untrained return thunk", map[string]string{
			"spec_rstack_overflow": "Mitigation: SMT disabled",
			"retbleed":             "Mitigation: untrained return thunk; SMT enabled with STIBP protection",
			"spectre_v2":           "Mitigation: Retpolines",
		}, []string{"retbleed/return", "spectre_v2/indirect call"}, "retbleed_return_thunk"},
		{"Intel Skylake, call depth stuffing", map[string]string{
			"retbleed": "Mitigation: Stuffing",
		}, []string{"retbleed/call"}, "every call pays call depth accounting"},
		{"an old kernel without the three entries", map[string]string{"meltdown": "Mitigation: PTI"}, nil, "spec_rstack_overflow: not reported"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := Read(fixture(t, c.files))
			if err != nil {
				t.Fatal(err)
			}
			if len(r) != len(c.files) {
				t.Errorf("read %d entries, want %d", len(r), len(c.files))
			}
			var got []string
			for _, cost := range r.CallCosts() {
				got = append(got, cost.Name+"/"+cost.Per)
			}
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Errorf("costs %v, want %v", got, c.want)
			}
			if s := r.Summary(); !strings.Contains(s, c.in) {
				t.Errorf("summary %q lacks %q", s, c.in)
			}
		})
	}
}

func TestReadNoReport(t *testing.T) {
	if _, err := Read(t.TempDir()); !errors.Is(err, ErrNoReport) {
		t.Fatalf("Read of a root without the report: %v, want ErrNoReport", err)
	}
}

// TestReadSorted checks that Read returns entries by name, each line
// without its newline.
func TestReadSorted(t *testing.T) {
	r, err := Read(fixture(t, map[string]string{"b": "Not affected", "a": "Vulnerable"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(r) != 2 || r[0] != (Entry{"a", "Vulnerable"}) || r[1] != (Entry{"b", "Not affected"}) {
		t.Fatalf("read %+v", r)
	}
}
