package main

import (
	"strings"
	"testing"
)

// TestCheckProtectFacilities: check prints the protected facilities with
// their numbers (docs/design.md §7), and a name that is not a facility
// exits 2 naming the key and the value.
func TestCheckProtectFacilities(t *testing.T) {
	src := "max: 1000\nseverity:\n  shed_first: [debug]\n  protect_facilities: [auth, authpriv, audit, alert]\n"
	code, out, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", src))
	want := "protected facilities (PRI / 8, whatever the severity, even a shed-first one): auth (4), authpriv (10), audit (13), alert (14)"
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "protect facilities auth,authpriv,audit,alert") {
		t.Errorf("exit %d, output lacks %q:\n%s%s", code, want, out, errs)
	}
	code, _, errs = runCmd(t, "check", "--config", writeFile(t, "bad.yaml", "max: 1000\nseverity:\n  protect_facilities: [auth, secure]\n"))
	if code != 2 || !strings.Contains(errs, `severity.protect_facilities[1]: "secure": bad facility`) {
		t.Errorf("bad facility: exit %d, stderr %q", code, errs)
	}
}
