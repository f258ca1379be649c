package tiers

import (
	"strings"
	"testing"
)

// TestAutoLawProse: the law's words are its constants' values, as check
// and the agent's log printed them when they were written by hand.
func TestAutoLawProse(t *testing.T) {
	lines := strings.Join(AutoLawLines(AutoMax{Start: 20000, Floor: 500, Ceiling: 90000}), "\n")
	for _, want := range []string{
		"β = 0.7 after a window that dropped over 30%, else 0.9", "at least a cut to × 0.9 when the collector's buffer is over half full",
		"receive buffer over half full and 2% of it fuller", "2 windows in a row", "under half full: max + 200 (start/100)",
		"once max is 10% over the last max with drops", "doubling steps up to 3200; not above 90000",
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("AutoLawLines lacks %q:\n%s", want, lines)
		}
	}
	const summary = "drops: max×max(0.7, 1-drops/delivered), at most ×0.9 from a buffer over half full; 2 clean windows while shedding: max+step (start/100, doubling beyond 10% over the last max with drops, up to ×16)"
	if got := AutoLawSummary(); got != summary {
		t.Errorf("AutoLawSummary:\n got %s\nwant %s", got, summary)
	}
}
