package testenv

import (
	"testing"
	"time"
)

// TestPacerMissed: a loop away for 40 ms of a 100 ms window (margin 30 ms) leaves that
// window and the next one out; a loop that keeps to its steps leaves
// nothing out.
func TestPacerMissed(t *testing.T) {
	const window = 100 * time.Millisecond
	pc := NewPacer(window, 4)
	pc.Margin = 0.3 // 30 ms: a busy machine's ordinary stalls stay below it
	stalled := false
	for el := pc.Now(); el < pc.Span(); el = pc.Now() {
		if int(el/window) == 1 && !stalled {
			time.Sleep(40 * time.Millisecond)
			stalled = true
		}
		pc.Sleep()
	}
	if pc.Missed(0) {
		t.Errorf("window 0 missed (stall %v); want judged", pc.Stall(0))
	}
	if !pc.Missed(1) || !pc.Missed(2) {
		t.Errorf("windows 1 and 2 judged (stalls %v, %v); want both left out after a 40 ms stall in window 1", pc.Stall(1), pc.Stall(2))
	}
	if pc.Stall(1) < 40*time.Millisecond {
		t.Errorf("stall in window 1 %v; want at least 40ms", pc.Stall(1))
	}
}
