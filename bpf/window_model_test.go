package bpf_test

import (
	"fmt"
	"testing"
)

// The window's opening as the exact path sees it (window.h window_open,
// window_count, overflow_mark), as steps of the model checker
// (model_test.go). The scene: window 5 is saturated past its overflow
// (1000 packets in the CPUs' slots) and marked, and a reload raised last_n
// to 100, so an exact-path packet adds the overflow sum to its n. CPU 0 is
// that packet, CPU 1 opens window 6, CPU 2 is a packet still judged by the
// old policy (last_n 10) that counts itself in its overflow slot and marks
// the window. The check: no packet adds the overflow of one window to a
// count of another, beyond what a racing CPU misfiled (one packet).
const (
	wCount = iota
	wOpened
	wOvf
	wSumOld // overflow slots of window 5
	wSumNew // of window 6
	wSwapped
)

const (
	oldID     = 5
	newLastN  = 100
	oldLastN  = 10
	ovfClosed = int64(1) << 62 // TL_OVF_CLOSED, scaled to int64
)

// Reader locals.
const (
	rC = iota
	rN
	rID
	rOv
	rWin   // window of its count: 5 or 6
	rAdded // window whose overflow it added, plus 1; 0 for none
)

func wstep(f func(s *mstate, t int)) mstep {
	return func(s *mstate, t int) int { f(s, t); return 0 }
}

// decide is the exact path's end: add window id's overflow when the mark
// says it has some.
var decide = wstep(func(s *mstate, t int) {
	l := &s.loc[t]
	if l[rOv] == l[rID]+1 && l[rN] < newLastN {
		l[rAdded] = l[rID] + 1
		l[rN] += s.mem[wSumOld+l[rID]-oldID]
	}
})

// fetchAdd is the exact path's add to the shared count.
var fetchAdd = wstep(func(s *mstate, t int) {
	s.loc[t][rN] = s.mem[wCount] + 1
	s.mem[wCount]++
	s.loc[t][rWin] = oldID + s.mem[wSwapped]
})

var (
	loadC  = wstep(func(s *mstate, t int) { s.loc[t][rC] = s.mem[wCount] })
	loadID = wstep(func(s *mstate, t int) { s.loc[t][rID] = s.mem[wOpened] })
	loadOv = wstep(func(s *mstate, t int) { s.loc[t][rOv] = s.mem[wOvf] })
)

// readerNow is window_count's exact path: the add, then (in any order)
// the id and the mark.
func readerNow() [][]mstep {
	return seqs([]mstep{loadC}, []mstep{fetchAdd}, []mstep{loadID, loadOv}, []mstep{decide})
}

// readerBefore is the exact path this replaced: id, count and mark read
// (in any order) before the add.
func readerBefore() [][]mstep {
	return seqs([]mstep{loadID, loadC, loadOv}, []mstep{fetchAdd}, []mstep{decide})
}

var swapCount = wstep(func(s *mstate, t int) { s.mem[wCount], s.mem[wSwapped] = 1, 1 })

// openerNow is window_open: close the mark, increment the id, exchange the
// count, each a fully ordered atomic (the id before the count since issue
// 39: TestWindowGapModel).
func openerNow() [][]mstep {
	return seqs(
		[]mstep{wstep(func(s *mstate, t int) { s.mem[wOvf] = ovfClosed | (s.mem[wOpened] + 1) })},
		[]mstep{wstep(func(s *mstate, t int) { s.mem[wOpened]++ })},
		[]mstep{swapCount})
}

// openerIssue25 is window_open from issue 25 to 39: close the mark,
// exchange the count, increment the id.
func openerIssue25() [][]mstep {
	return seqs(
		[]mstep{wstep(func(s *mstate, t int) { s.mem[wOvf] = ovfClosed | (s.mem[wOpened] + 1) })},
		[]mstep{swapCount},
		[]mstep{wstep(func(s *mstate, t int) { s.mem[wOpened]++ })})
}

// openerBefore clears the mark and increments the id with plain stores.
func openerBefore() [][]mstep {
	return seqs(
		[]mstep{wstep(func(s *mstate, t int) { s.mem[wOvf] = 0 })},
		[]mstep{swapCount},
		[]mstep{wstep(func(s *mstate, t int) { s.mem[wOpened]++ })})
}

// markerSteps is a packet of the old policy on the saturated path: count
// and id read in any order, then its mark (mark) and its slot.
func markerSteps(mark mstep) [][]mstep {
	file := wstep(func(s *mstate, t int) {
		if l := &s.loc[t]; l[rC]+1 >= oldLastN {
			s.mem[wSumOld+l[rID]-oldID]++
		}
	})
	return seqs([]mstep{loadC, loadID}, []mstep{loadOv}, []mstep{mark}, []mstep{file})
}

// markNow is overflow_mark: a compare-and-swap that only moves forward.
var markNow = wstep(func(s *mstate, t int) {
	l := &s.loc[t]
	if l[rC]+1 < oldLastN || l[rOv] == l[rID]+1 {
		return
	}
	if cur := s.mem[wOvf]; cur&^ovfClosed < l[rID]+1 {
		s.mem[wOvf] = l[rID] + 1
	}
})

// markBefore is the plain store it replaced.
var markBefore = wstep(func(s *mstate, t int) {
	if l := &s.loc[t]; l[rC]+1 >= oldLastN && l[rOv] != l[rID]+1 {
		s.mem[wOvf] = l[rID] + 1
	}
})

func windowCheck(s *mstate) error {
	l := s.loc[0]
	if l[rAdded] == 0 || l[rAdded]-1 == l[rWin] {
		return nil
	}
	if added := s.mem[wSumOld+l[rAdded]-1-oldID]; l[rAdded]-1 == oldID || added > 1 {
		return fmt.Errorf("a packet counted in window %d added window %d's overflow (%d): n %d", l[rWin], l[rAdded]-1, added, l[rN])
	}
	return nil
}

// windowExplore checks every program order of the three CPUs' plain steps
// and every interleaving; it returns the first violation.
func windowExplore(readers, openers, markers [][]mstep) (int, error) {
	init := mstate{mem: [8]int64{wCount: 10, wOpened: oldID, wOvf: oldID + 1, wSumOld: 1000}}
	states := 0
	for _, r := range readers {
		for _, o := range openers {
			for _, m := range markers {
				n, err := explore(init, [][]mstep{r, o, m}, windowCheck)
				states += n
				if err != nil {
					return states, err
				}
			}
		}
	}
	return states, nil
}

// TestWindowOrderModel is issue 25 §3: with the window's plain loads and
// stores in any order between the atomics (arm64), no exact-path packet
// of the new window adds the old window's overflow to its n. The exact
// path and opening they replaced fail the same check.
func TestWindowOrderModel(t *testing.T) {
	states, err := windowExplore(readerNow(), openerNow(), markerSteps(markNow))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d states: no packet adds another window's overflow", states)
	if _, err := windowExplore(readerNow(), openerIssue25(), markerSteps(markNow)); err != nil {
		t.Errorf("the opening of issues 25 to 39: %v", err)
	}
	if _, err := windowExplore(readerBefore(), openerBefore(), markerSteps(markBefore)); err == nil {
		t.Fatal("the protocol it replaced passes the check: the check cannot fail")
	} else {
		t.Logf("the protocol it replaced: %v", err)
	}
}
