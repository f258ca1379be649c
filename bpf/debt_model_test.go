package bpf_test

import (
	"fmt"
	"testing"
)

// The drop debt's protocol (severity.h severity_verdict) as steps of the
// model checker (model_test.go). Memory: the debt, and the datagrams that
// protection passed and payers paid off (which the program's counters
// hold); the bound is that the debt stays in [0, budget] and equals what
// was passed less what was paid, so protection never gives the collector
// more than the budget.
const (
	mDebt = iota
	mPassed
	mPaid
)

// debtTries is TL_DEBT_TRIES.
const debtTries = 4

// debtPacket is one packet of a CPU: protected with a drop verdict (it may
// add segs to the debt) or unprotected with a pass verdict (it may pay).
type debtPacket struct {
	protected bool
	segs      int64
}

// debtCPU is a CPU's packets, one after another, as steps of today's
// protocol: a load, then up to debtTries compare-and-swaps, each from the
// value the previous one found.
func debtCPU(budget int64, pkts []debtPacket) []mstep {
	per := 1 + debtTries
	var steps []mstep
	for k, pk := range pkts {
		next := (k + 1) * per
		if k+1 == len(pkts) {
			next = -1
		}
		steps = append(steps, func(s *mstate, t int) int {
			s.loc[t][0] = s.mem[mDebt]
			return k*per + 1
		})
		for i := range debtTries {
			retry := k*per + 2 + i
			if i+1 == debtTries {
				retry = next
			}
			steps = append(steps, func(s *mstate, t int) int {
				d := s.loc[t][0]
				var to, add int64
				switch {
				case pk.protected && (d > budget || pk.segs > budget-d):
					return next
				case pk.protected:
					to, add = d+pk.segs, pk.segs
				case d <= 0:
					return next
				default:
					add = -min(d, pk.segs)
					to = d + add
				}
				if seen := s.mem[mDebt]; seen != d {
					s.loc[t][0] = seen
					return retry
				}
				s.mem[mDebt] = to
				if add > 0 {
					s.mem[mPassed] += add
				} else {
					s.mem[mPaid] -= add
				}
				return next
			})
		}
	}
	return steps
}

// debtCPUBefore is the protocol this replaced, for one-datagram packets:
// read, add (or subtract), and undo when the add overshot.
func debtCPUBefore(budget int64, pkts []debtPacket) []mstep {
	var steps []mstep
	for k, pk := range pkts {
		base, next := 3*k, 3*(k+1)
		if k+1 == len(pkts) {
			next = -1
		}
		sign := int64(1)
		if !pk.protected {
			sign = -1
		}
		steps = append(steps,
			func(s *mstate, t int) int {
				d := s.mem[mDebt]
				if (pk.protected && d >= budget) || (!pk.protected && d <= 0) {
					return next
				}
				return base + 1
			},
			func(s *mstate, t int) int {
				old := s.mem[mDebt]
				s.mem[mDebt] += sign
				if pk.protected && old < budget {
					s.mem[mPassed]++
					return next
				}
				if !pk.protected && old > 0 {
					s.mem[mPaid]++
					return next
				}
				return base + 2
			},
			func(s *mstate, t int) int {
				s.mem[mDebt] -= sign
				return next
			})
	}
	return steps
}

// debtCheck is the bound, for a window that opened with debt init.
func debtCheck(budget, init int64, strict bool) func(*mstate) error {
	return func(s *mstate) error {
		net := init + s.mem[mPassed] - s.mem[mPaid]
		if net > budget || net < 0 {
			return fmt.Errorf("passed %d, paid %d from debt %d: %d extra, budget %d", s.mem[mPassed], s.mem[mPaid], init, net, budget)
		}
		if strict && (s.mem[mDebt] != net || s.mem[mDebt] < 0) {
			return fmt.Errorf("debt %d, but %d passed and %d paid from %d", s.mem[mDebt], s.mem[mPassed], s.mem[mPaid], init)
		}
		return nil
	}
}

// debtConfigs calls f with every assignment of packets (protected or not,
// of 1 or 2 datagrams) to cpus CPUs of perCPU packets each.
func debtConfigs(cpus, perCPU int, maxSegs int64, f func([][]debtPacket)) {
	kinds := []debtPacket{}
	for segs := int64(1); segs <= maxSegs; segs++ {
		kinds = append(kinds, debtPacket{true, segs}, debtPacket{false, segs})
	}
	n := cpus * perCPU
	idx := make([]int, n)
	for {
		cfg := make([][]debtPacket, cpus)
		for i, k := range idx {
			cfg[i/perCPU] = append(cfg[i/perCPU], kinds[k])
		}
		f(cfg)
		i := 0
		for ; i < n; i++ {
			if idx[i]++; idx[i] < len(kinds) {
				break
			}
			idx[i] = 0
		}
		if i == n {
			return
		}
	}
}

// TestDebtModel is issue 25 §3: with every interleaving of 2 or 3 CPUs'
// packets, at budgets 1 and 2 and every starting debt, the debt never
// leaves [0, budget] and always equals protected passes less payments.
// The protocol it replaced fails the same check (the trace: two
// payers read 1, one pays, the other's decrement fails to -1, two
// protected packets pass, the undo leaves 2).
func TestDebtModel(t *testing.T) {
	states, configs := 0, 0
	for budget := int64(1); budget <= 2; budget++ {
		for init := int64(0); init <= budget; init++ {
			for _, shape := range []struct {
				cpus, per int
				segs      int64
			}{{2, 2, 2}, {3, 1, 2}, {3, 2, 1}} {
				debtConfigs(shape.cpus, shape.per, shape.segs, func(cfg [][]debtPacket) {
					progs := make([][]mstep, len(cfg))
					for i, pk := range cfg {
						progs[i] = debtCPU(budget, pk)
					}
					n, err := explore(mstate{mem: [8]int64{mDebt: init}}, progs, debtCheck(budget, init, true))
					if err != nil {
						t.Fatalf("budget %d, debt %d, packets %+v: %v", budget, init, cfg, err)
					}
					states += n
					configs++
				})
			}
		}
	}
	t.Logf("%d configurations, %d states: the debt stays in [0, budget]", configs, states)

	// The protocol it replaced, on the packets: the check finds it.
	cfg := [][]debtPacket{{{false, 1}}, {{false, 1}}, {{true, 1}}, {{true, 1}}}
	progs := make([][]mstep, len(cfg))
	for i, pk := range cfg {
		progs[i] = debtCPUBefore(1, pk)
	}
	_, err := explore(mstate{mem: [8]int64{mDebt: 1}}, progs, debtCheck(1, 1, false))
	if err == nil {
		t.Fatal("the add-and-undo protocol passes the check: the check cannot fail")
	}
	t.Logf("the add-and-undo protocol: %v", err)
}
