package bpf_test

import (
	"fmt"
	"testing"
)

// window_open's gap (issue 39 item 4) as steps of the model checker
// (model_test.go): CPU 0 opens window 6 (window.h window_open: the id
// moves, the count is reset, each a fully ordered atomic), CPUs 1 and 2
// each count a packet of their own (window_count without the expiry):
// count and id read as plain loads in either order; a count at or past
// saturation (count + 1 >= last_n) judges the packet on that count and id;
// else the exact path adds to the count (an atomic) and reads the id
// after. The check: no packet is judged on a count of the new window (a
// reset count) with the old window's id, whose estimate would judge a
// count of 1 in a window of thousands.
const (
	gCount = iota
	gOpened
	gReset // 1 once the count is reset
)

// Reader locals.
const (
	gC    = iota // the count it is judged on
	gCWin        // the window of that count: 5 or 6
	gID          // the id it is judged with
	gDone        // 1 once judged
)

const gapOldID = 5

func gapReaders(lastN int64) [][]mstep {
	loadC := wstep(func(s *mstate, t int) {
		s.loc[t][gC], s.loc[t][gCWin] = s.mem[gCount], gapOldID+s.mem[gReset]
	})
	loadID := wstep(func(s *mstate, t int) { s.loc[t][gID] = s.mem[gOpened] })
	// Past saturation the packet is judged on what it read: done.
	saturated := func(s *mstate, t int) int {
		if s.loc[t][gC]+1 >= lastN {
			s.loc[t][gDone] = 1
			return -1
		}
		return 0
	}
	fetchAdd := wstep(func(s *mstate, t int) {
		s.mem[gCount]++
		s.loc[t][gC], s.loc[t][gCWin] = s.mem[gCount], gapOldID+s.mem[gReset]
	})
	done := wstep(func(s *mstate, t int) { s.loc[t][gDone] = 1 })
	return seqs([]mstep{loadC, loadID}, []mstep{saturated}, []mstep{fetchAdd}, []mstep{loadID}, []mstep{done})
}

var (
	gapBump  = wstep(func(s *mstate, t int) { s.mem[gOpened]++ })
	gapReset = wstep(func(s *mstate, t int) { s.mem[gCount], s.mem[gReset] = 1, 1 })
)

// gapExplore runs the opener against two readers, every program order of
// the readers' plain loads and every interleaving, from an old window of
// count 10. It returns the states visited, how many readers were judged on
// the old window's count with the new id (allowed: the count is at least
// the packet's true one), and the first violation.
func gapExplore(opener []mstep, lastN int64) (states, late int, err error) {
	init := mstate{mem: [8]int64{gCount: 10, gOpened: gapOldID}}
	seenLate := map[[2]int64]bool{}
	for _, r1 := range gapReaders(lastN) {
		for _, r2 := range gapReaders(lastN) {
			n, err := explore(init, [][]mstep{opener, r1, r2}, func(s *mstate) error {
				for t := 1; t <= 2; t++ {
					l := s.loc[t]
					if l[gDone] == 0 {
						continue
					}
					if l[gCWin] != gapOldID && l[gID] == gapOldID {
						return fmt.Errorf("CPU %d judged on the new window's count %d with the old id %d", t, l[gC], l[gID])
					}
					if l[gCWin] == gapOldID && l[gID] != gapOldID && !seenLate[[2]int64{l[gC], l[gID]}] {
						seenLate[[2]int64{l[gC], l[gID]}] = true
					}
				}
				return nil
			})
			states += n
			if err != nil {
				return states, len(seenLate), err
			}
		}
	}
	return states, len(seenLate), nil
}

// TestWindowGapModel: with the id moved before the count is reset, no
// packet on another CPU is judged on a reset count with the old id, on the
// exact path (last_n 100) or past saturation (last_n 10), whatever the
// order of each reader's plain loads. The order it replaced (the count
// reset, then the CPUs' overflow summed, then the id moved) fails.
func TestWindowGapModel(t *testing.T) {
	for _, lastN := range []int64{100, 10} {
		states, late, err := gapExplore(seqs([]mstep{gapBump}, []mstep{gapReset})[0], lastN)
		if err != nil {
			t.Fatalf("last_n %d: %v", lastN, err)
		}
		t.Logf("last_n %d: %d states, no packet judged on a reset count with the old id; %d (count, id) pairs of the old count with the new id", lastN, states, late)
		if _, _, err := gapExplore(seqs([]mstep{gapReset}, []mstep{gapBump})[0], lastN); err == nil {
			t.Errorf("last_n %d: the order it replaced passes the check: the check cannot fail", lastN)
		} else {
			t.Logf("last_n %d, the order it replaced: %v", lastN, err)
		}
	}
}
