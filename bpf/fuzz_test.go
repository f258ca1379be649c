package bpf_test

import (
	"testing"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/model"
)

// FuzzProgram runs random and mutated frames through the program and the
// Go reference classifier (model.ClassifyOn, on an interface with every
// host check on). The program must never drop or count a frame the
// classifier calls unselected, and must count every frame exactly once, in
// the class (and malformed reason) the classifier gives. A selected frame
// runs at a window count picked from the frame (empty, each tier's first
// n, saturated): it must be counted in the tier that the compiled table
// gives its n, and dropped or passed as that entry's threshold says
// (always, never, or either for a random draw).
func FuzzProgram(f *testing.F) {
	for _, tc := range verdictCases(f) {
		f.Add(tc.frame)
	}
	h := newHarness(f, testPolicy(f))
	// The frames arrive on lo (BPF_PROG_TEST_RUN's), described with every
	// check of frames Linux discards on (bpf/host.h).
	ifc := model.Iface{MAC: [6]byte(testenv.DstMAC), CheckMAC: true, Martians: true, LocalnetMartian: true}
	if _, err := h.l.SetIfaces(describe(ifc)); err != nil {
		f.Fatal(err)
	}
	loads := []uint64{0, 1_000_000_000}
	for k := range h.tab.Bounds {
		loads = append(loads, h.tab.TierStart(k+1)-1)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 {
			return // BPF_PROG_TEST_RUN refuses XDP frames shorter than ETH_HLEN
		}
		h.tb = t
		c := model.ClassifyOn(h.p, ifc, frame)
		h.preload(loads[len(frame)%len(loads)])
		s0, w0 := h.stats(), h.window()
		ret := h.run(frame)
		s1, w1 := h.stats(), h.window()
		d := diff(s0, s1, w0, w1)
		switch c.Class {
		case model.ClassUnselected:
			if ret != xdpPass || d != unselected {
				t.Fatalf("unselected frame: action %d, counters %+v\n% x", ret, d, frame)
			}
		case model.ClassSelected:
			if d != wantDelta(c) {
				t.Fatalf("selected frame: counters %+v\n% x", d, frame)
			}
			checkTableVerdict(t, h, s0, s1, w1.Count, ret, frame)
		case model.ClassExempt:
			if ret != xdpPass || d != exempt {
				t.Fatalf("exempt frame: action %d, counters %+v\n% x", ret, d, frame)
			}
		case model.ClassFragment:
			if !(d == fragPass && ret == xdpPass) && !(d == fragDrop && ret == xdpDrop) {
				t.Fatalf("non-first fragment: action %d, counters %+v\n% x", ret, d, frame)
			}
		case model.ClassMalformed:
			want := uint32(xdpPass)
			if c.Drops(h.p) {
				want = xdpDrop
			}
			if ret != want || d != malformedAs(c.Malformed) {
				t.Fatalf("malformed frame (%v): action %d, counters %+v, want action %d\n% x", c.Malformed, ret, d, want, frame)
			}
		}
	})
}

// checkTableVerdict checks a selected frame counted at window count n
// against the compiled table: its tier, and its action where the entry's
// threshold leaves no draw.
func checkTableVerdict(t *testing.T, h *harness, s0, s1 bpf.Stats, n uint64, ret uint32, frame []byte) {
	t.Helper()
	idx := min(n>>h.tab.Shift, uint64(len(h.tab.Thresholds)-1))
	wantTier, thr := int(h.tab.Tiers[idx]), h.tab.Thresholds[idx]
	tier, verdict := -1, tiers.Verdict(0)
	for k := range s1.Selected {
		for _, v := range tiers.Verdicts {
			if s1.Selected[k][v].Packets != s0.Selected[k][v].Packets {
				tier, verdict = k, v
			}
		}
	}
	if tier != wantTier {
		t.Fatalf("selected frame at n=%d: counted in tier %d, the table says %d\n% x", n, tier, wantTier, frame)
	}
	wantRet := map[tiers.Verdict]uint32{tiers.VerdictPass: xdpPass, tiers.VerdictDrop: xdpDrop, tiers.VerdictWouldDrop: xdpPass}[verdict]
	switch {
	case ret != wantRet:
		t.Fatalf("selected frame at n=%d: action %d for verdict %v\n% x", n, ret, verdict, frame)
	case thr == tiers.AlwaysDrop && ret != xdpDrop, thr == 0 && ret != xdpPass:
		t.Fatalf("selected frame at n=%d: action %d, the table's threshold %#x says otherwise\n% x", n, ret, thr, frame)
	}
}
