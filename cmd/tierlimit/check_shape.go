package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// The shape in check (docs/design.md §9): one line in the summary, and for
// smooth the pass rate the tiers allow and the estimator that reads R.

// shapeSummary is the summary's shape line: the shape and what it does
// with a window's passes.
func shapeSummary(s tiers.Shape) string {
	if s == tiers.ShapeSmooth {
		return "smooth: each selected packet is dropped with probability q(R̂) = 1 − P(R̂)/R̂, R̂ the running estimate of the window's offered count; the passes are spread over the window"
	}
	return "ordinal: the seed's rule, a packet is judged by its position n in the window; under a flood the window's passes arrive in a burst at its start"
}

// smoothLoads are the offered loads of the smooth pass-rate table, as
// multiples of max.
var smoothLoads = []struct {
	name     string
	num, den uint64
}{{"0.5 × max", 1, 2}, {"1 × max", 1, 1}, {"2 × max", 2, 1}, {"5 × max", 5, 1}, {"10 × max", 10, 1}}

// printSmooth prints, for the smooth shape, the pass rate the tiers allow
// at smoothLoads: P(R) per window and per tenth of a window, as a rate, and
// the per-packet drop ratio q(R) the program draws against (Table.Smooth);
// then the estimator.
func printSmooth(out io.Writer, p tiers.Policy, t tiers.Table) error {
	fmt.Fprintln(out, "smooth pass rate: a window offered R passes P(R), spread over the window; each packet is dropped with q(R) = 1 − P(R)/R")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "OFFERED\tR\tP(R) PER WINDOW\tPER TENTH\tPASS RATE\tq(R)\t")
	for _, l := range smoothLoads {
		r := p.TableMax() * l.num / l.den
		e := t.Expected(r)
		_, thr := t.Smooth(r)
		fmt.Fprintf(w, "%s\t%d\t%.1f\t%.1f\t%s\t%.2f%%\t\n", l.name, r, e.Passed, e.Passed/10,
			perSecond(e.Passed, p.Window), 100*tiers.DropRatio(thr))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "estimator: R̂ is the sliding window count S = n + the previous window's count × the part of its span still inside the last window;\n")
	fmt.Fprintf(out, "  E is the recent rate over a window: the count of the last 1/16 to 1/8 of a window (after an onset, for %d ticks, since the onset on the clock) × the window;\n",
		tiers.SmoothClockTicks)
	fmt.Fprintf(out, "  an onset is E past 5/4 × S with n ≥ %d since the rate's reference, wherever it falls in a window; then R̂ = max(S, E) until E falls to S,\n", tiers.SmoothOnsetMin)
	fmt.Fprintf(out, "  across window ends; recomputed once per tick, %s\n", smoothTick())
	if t.Sources.Budget != 0 {
		fmt.Fprintf(out, "  with budgets, in an onset in-budget packets are judged on max(S, the spent budgets + the rate of the groups within theirs × the window)\n")
	}
	fmt.Fprintf(out, "bursts: a burst at more than 5/4 of the last window's rate is read as a flood's onset and shed at q(E) while E is past T_1 = %d,\n", p.Thresholds()[0])
	fmt.Fprintf(out, "  even in a window that ends below it: it cannot be told from a flood's first ticks; where such bursts are the normal load, shape: ordinal passes\n")
	fmt.Fprintf(out, "  every window below T_1 whole; shape smooth needs a window of at least %v (20 ticks at HZ 100)\n", tiers.SmoothMinWindow)
	return nil
}

// perSecond writes passes per window as a rate per second.
func perSecond(passes float64, window time.Duration) string {
	if window <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f/s", passes/window.Seconds())
}

// smoothTick names the estimate's tick on this host: the kernel's jiffy,
// which the program's tick gate counts, or the clock's 2^22 ns when the
// kernel's tick is unknown (bpf.Limiter.TickNs).
func smoothTick() string {
	clock := time.Duration(1 << tiers.SmoothTickShift)
	if ns, err := bpf.KernelTick(); err == nil {
		return fmt.Sprintf("the kernel's jiffy (%v on this host)", time.Duration(ns))
	}
	return fmt.Sprintf("2^%d ns of the clock (%v: this host's kernel tick is unknown)", tiers.SmoothTickShift, clock)
}
