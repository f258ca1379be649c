package bpf_test

import (
	"testing"

	"github.com/tierlimit/tierlimit/tiers"
)

// FuzzProgram runs random and mutated frames through the program and the
// Go reference classifier, with the window saturated so that selected
// packets are dropped. The program must never drop or count a frame the
// classifier calls unselected, and must count every frame exactly once, in
// the class the classifier gives.
func FuzzProgram(f *testing.F) {
	for _, tc := range verdictCases(f) {
		f.Add(tc.frame)
	}
	h := newHarness(f, testPolicy(f))
	h.preload(1_000_000_000)
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 {
			return // BPF_PROG_TEST_RUN refuses XDP frames shorter than ETH_HLEN
		}
		h.tb = t
		c := tiers.Classify(h.p, frame)
		s0, w0 := h.stats(), h.window()
		ret := h.run(frame)
		d := diff(s0, h.stats(), w0, h.window())
		switch c.Class {
		case tiers.ClassUnselected:
			if ret != xdpPass || d != unselected {
				t.Fatalf("unselected frame: action %d, counters %+v\n% x", ret, d, frame)
			}
		case tiers.ClassSelected:
			if d != selected {
				t.Fatalf("selected frame: counters %+v\n% x", d, frame)
			}
		case tiers.ClassExempt:
			if ret != xdpPass || d != exempt {
				t.Fatalf("exempt frame: action %d, counters %+v\n% x", ret, d, frame)
			}
		case tiers.ClassFragment:
			if !(d == fragPass && ret == xdpPass) && !(d == fragDrop && ret == xdpDrop) {
				t.Fatalf("non-first fragment: action %d, counters %+v\n% x", ret, d, frame)
			}
		}
	})
}
