package main

import (
	"strings"
	"testing"
)

// TestCheckSaysEncapNotParsed (issue 35 B56): check says plainly that
// encapsulated traffic is not parsed and what that means for a collector
// behind an encapsulating balancer.
func TestCheckSaysEncapNotParsed(t *testing.T) {
	code, out, errs := runCmd(t, "check")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"encapsulated traffic is not parsed", "IPIP", "GUE", "not protected"} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
}
