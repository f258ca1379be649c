package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestCheckBytes: under count: bytes, check says what the window counts
// and how TCP counts, gives max, the tiers, the table's step and rounding,
// the expectations and the budget in bytes; a byte unit on a packet
// policy, a count other than packets or bytes, and a size of 0 exit 2
// naming the key and the value.
func TestCheckBytes(t *testing.T) {
	const src = "count: bytes\nmax: 10MB\nshape: ordinal\ntiers: [{at: 70%, drop: 20%}, {at: 100%, drop: 100%}]\n" +
		"select: [{proto: udp, ports: [514]}, {proto: tcp, ports: [601], count: syn}]\nsources: {budget: 64KiB}\n"
	code, raw, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", src))
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	out := strings.Join(strings.Fields(raw), " ")
	for _, w := range []string{
		"count bytes: each selected UDP datagram weighs its payload (UDP length - 8",
		"tcp tcp/601 syn to local: SYNs are judged at the window's bytes (a SYN weighs its payload, 0); every other segment's payload is counted in the window and never shed",
		"max 10000000 bytes (10 MB) of syslog payload per window",
		"TIER AT BYTES n DROP TABLE FROM n",
		"1 70% [7000000, 10000000) 20% 7000000",
		// 10^7 bytes need 2^20 entries at a step of 2^4: 7000000 and
		// 10000000 are multiples of 16.
		"table 625001 entries, step 16 bytes (n >> 4) rounding: exact",
		"(in bytes: n, PASSED and DROPPED are bytes of payload",
		"sources: budget 65536 = 65536 bytes per window for each /32",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("check output lacks %q:\n%s", w, raw)
		}
	}
	// Rounding in bytes: a threshold off the step moves up to it.
	code, raw, _ = runCmd(t, "check", "--config", writeFile(t, "p.yaml", strings.Replace(src, "10MB", "10000007", 1)))
	if out := strings.Join(strings.Fields(raw), " "); code != 0 || !regexp.MustCompile(`rounding: tier boundaries move later by at most [1-9][0-9]* bytes`).MatchString(out) {
		t.Errorf("exit %d, output lacks the rounding in bytes:\n%s", code, raw)
	}
	for _, c := range []struct{ src, want string }{
		{"max: 10MB\n", `line 1: max: "10MB": byte unit on a packet policy`},
		{"count: packets\nmax: 100\nsources: {budget: 4KB}\n", `line 3: sources.budget: "4KB": byte unit on a packet policy`},
		{"count: bogus\n", `line 1: count: "bogus": bad count: want packets or bytes`},
		{"count: bytes\nmax: 0B\n", `line 2: max: "0B": max out of range: must be from 1 to 1099511627776 bytes`},
		{"count: bytes\nmax: -1MB\n", `line 2: max: "-1MB": wrong type`},
	} {
		code, _, errs := runCmd(t, "check", "--config", writeFile(t, "p.yaml", c.src))
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("check of %q: exit %d, stderr %q; want 2 and %q", c.src, code, errs, c.want)
		}
	}
}
