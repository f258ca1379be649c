package main

import (
	"strings"
	"testing"
)

// TestDemoRecord runs `tierlimit demo --record`: the episode's reports
// arrive in order (open, summaries, close), the summaries name the two
// noisy senders first, and samples print with their comments.
func TestDemoRecord(t *testing.T) {
	out, _ := demoCLI(t, "--record", "--max", "200", "--window", "500ms")
	var events []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "syslog <- ") {
			continue
		}
		_, ev, _ := strings.Cut(line, `event="`)
		ev, _, _ = strings.Cut(ev, `"`)
		events = append(events, ev)
		if ev == "summary" && !strings.Contains(line, `top_sampled="198.51.100.10/32:`) {
			t.Errorf("summary does not name the noisiest sender first: %s", line)
		}
	}
	if len(events) < 3 || events[0] != "open" || events[len(events)-1] != "close" {
		t.Errorf("reports %v, want open, summaries, close", events)
	}
	if n := strings.Count(out, "reason=tier"); n != recordSamples {
		t.Errorf("%d sample comments printed, want %d", n, recordSamples)
	}
}
