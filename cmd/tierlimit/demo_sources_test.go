package main

import (
	"strconv"
	"strings"
	"testing"
)

// TestDemoNoisySource runs `tierlimit demo --noisy-source`: with sources,
// every light sender's datagrams pass and the noisy one gets its budget,
// as the model says; without, the light senders lose most of theirs.
func TestDemoNoisySource(t *testing.T) {
	out, _ := demoCLI(t, "--noisy-source", "--max", "200", "--window", "500ms")
	// rows[window] are the sender rows: address, sent, passed, model.
	rows := map[int][][]string{}
	window := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "window":
			window, _ = strconv.Atoi(f[1])
		case len(f) >= 4 && strings.HasPrefix(f[0], "198.51.100."):
			rows[window] = append(rows[window], f)
		}
	}
	if len(rows) != 4 {
		t.Fatalf("want 4 windows of sender rows:\n%s", out)
	}
	for w := 1; w <= 4; w++ {
		lightSent, lightPassed := 0, 0
		for i, r := range rows[w] {
			sent, _ := strconv.Atoi(r[1])
			passed, _ := strconv.Atoi(r[2])
			model, _ := strconv.Atoi(r[3])
			if w <= 2 && passed != model {
				t.Errorf("window %d (sources on), %s: passed %d, model %d", w, r[0], passed, model)
			}
			if w <= 2 && i == 0 && passed != 20 {
				t.Errorf("window %d: the noisy sender passed %d, want its budget 20", w, passed)
			}
			if i > 0 {
				lightSent += sent
				lightPassed += passed
			}
		}
		if w <= 2 && lightPassed != lightSent {
			t.Errorf("window %d (sources on): light senders passed %d of %d", w, lightPassed, lightSent)
		}
		if w > 2 && 2*lightPassed > lightSent {
			t.Errorf("window %d (sources off): light senders passed %d of %d, want most shed", w, lightPassed, lightSent)
		}
	}
}
