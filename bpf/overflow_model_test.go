package bpf_test

import (
	"errors"
	"testing"
)

// The overflow slot's reuse (window.h overflow_add) against a CPU that sums
// the slots (overflow_sum_cpu), issue 32 row 10. A slot last used by
// window id − 2 holds its count; the owner, at its first packet of window
// id, zeroes the counts and publishes id; a reader that sees id in the slot
// adds the slot's count to window id's. Memory: mem[0] the slot's window
// id, mem[1] its count. The reader keeps what it read in loc[0] (the id)
// and loc[1] (the count).
const (
	ovSlotOld = 1 // the slot's window before: id − 2
	ovSlotNew = 3 // the window the owner publishes: id
	ovStale   = 7 // window id − 2's count
)

func ovPublish(s *mstate, t int) int { s.mem[0] = ovSlotNew; return 0 }
func ovZero(s *mstate, t int) int    { s.mem[1] = 0; return 0 }
func ovReadID(s *mstate, t int) int  { s.loc[t][0] = s.mem[0]; s.loc[t][2]++; return 0 }
func ovReadN(s *mstate, t int) int   { s.loc[t][1] = s.mem[1]; s.loc[t][2]++; return 0 }

// overflowExplore runs the owner's and the reader's programs (every order
// of each group of plain steps) and checks that a reader done with both
// reads never adds window id − 2's count to window id.
func overflowExplore(owner, reader [][]mstep) (int, error) {
	states := 0
	for _, o := range owner {
		for _, r := range reader {
			init := mstate{}
			init.mem[0], init.mem[1] = ovSlotOld, ovStale
			n, err := explore(init, [][]mstep{o, r}, func(s *mstate) error {
				if s.loc[1][2] == 2 && s.loc[1][0] == ovSlotNew && s.loc[1][1] == ovStale {
					return errors.New("the reader added window id − 2's count to window id")
				}
				return nil
			})
			states += n
			if err != nil {
				return states, err
			}
		}
	}
	return states, nil
}

// TestOverflowReuseModel: the owner zeroes the counts and then publishes
// the id with an exchange (fully ordered), and the reader reads the id with
// a fetch-and-add of 0 (fully ordered) before the count: no reader adds the
// old window's count, whatever the plain steps' order on each side. The
// order it replaced (id published first, plain loads and stores) fails.
func TestOverflowReuseModel(t *testing.T) {
	now := func() (int, error) {
		return overflowExplore(seqs([]mstep{ovZero}, []mstep{ovPublish}), seqs([]mstep{ovReadID}, []mstep{ovReadN}))
	}
	states, err := now()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d states: no reader adds the old window's count", states)
	if _, err := overflowExplore(seqs([]mstep{ovPublish, ovZero}), seqs([]mstep{ovReadID, ovReadN})); err == nil {
		t.Fatal("the order it replaced passes the check: the check cannot fail")
	} else {
		t.Logf("the order it replaced: %v", err)
	}
}
