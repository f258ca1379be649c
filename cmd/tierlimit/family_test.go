package main

import (
	"strings"
	"testing"
)

// TestCheckFamilies: check prints each prefix with its family, and refuses
// an IPv4-mapped prefix, which would match no IPv4 packet (issue 10 §4).
func TestCheckFamilies(t *testing.T) {
	cfg := writeFile(t, "p.yaml", `max: 1000
tiers: [{at: 50%, drop: 0%}, {at: 100%, drop: 100%}]
select:
  - {proto: udp, ports: [514], dests: ["::/0", 10.99.0.0/24]}
exempt: {sources: ["::/0", 10.99.0.0/24]}
`)
	code, out, errs := runCmd(t, "check", "--config", cfg)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"::/0 (IPv6), 10.99.0.0/24 (IPv4)", "exempt sources: ::/0 (IPv6), 10.99.0.0/24 (IPv4)"} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}

	for _, bad := range []struct{ key, value, want string }{
		{"exempt", `{sources: ["::ffff:0:0/96"]}`, "write 0.0.0.0/0"},
		{"exempt", `{sources: ["::ffff:10.99.0.1"]}`, "write 10.99.0.1/32"},
	} {
		cfg := writeFile(t, "bad.yaml", "max: 1000\nselect: [{proto: udp, ports: [514]}]\n"+bad.key+": "+bad.value+"\n")
		code, _, errs := runCmd(t, "check", "--config", cfg)
		if code != 2 || !strings.Contains(errs, "IPv4-mapped") || !strings.Contains(errs, bad.want) || !strings.Contains(errs, "line 3") {
			t.Errorf("%s: %s: exit %d, stderr %q; want 2 and an IPv4-mapped error that says %q at line 3", bad.key, bad.value, code, errs, bad.want)
		}
	}
}
