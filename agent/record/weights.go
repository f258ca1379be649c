package record

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// Weights for the SIEM (docs/design.md §10): each report of an episode
// says, for the span since the report before it, what fraction of the
// selected datagrams reached the collector, in all, by severity class and
// over budget, from the program's per-CPU counters the tracker reads each
// window. A SIEM weights each event it received in the span by 1 / the
// fraction of its class: the sum of the weights is the span's offered
// count, exactly (passed / (passed / offered)).

// Fraction is a pass fraction as counted: datagrams that reached the
// collector (passed, and would_drop in dry-run, which passes) of those
// offered.
type Fraction struct {
	Passed  uint64 `json:"passed"`
	Offered uint64 `json:"offered"`
}

// Value is Passed / Offered, and 1 when nothing was offered.
func (f Fraction) Value() float64 {
	if f.Offered == 0 {
		return 1
	}
	return float64(f.Passed) / float64(f.Offered)
}

// Weight is 1 / Value: how many offered datagrams each one that reached the
// collector stands for. +Inf when none passed of some offered.
func (f Fraction) Weight() float64 { return 1 / f.Value() }

// Weights are the pass fractions of one report's span (From, To].
type Weights struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// All counts every selected datagram, over budget or not.
	All Fraction `json:"all"`
	// Classes counts the datagrams judged in the window by severity
	// class (tiers.SeverityClass names), under a severity block; those
	// over their group's budget are judged without severity, and are in
	// OverBudget alone.
	Classes    map[string]Fraction `json:"classes,omitempty"`
	OverBudget Fraction            `json:"over_budget"`
}

// fractionOf is the fraction of counters by verdict c, to less from.
func fractionOf(to, from [bpf.NumVerdicts]bpf.Counter) Fraction {
	var f Fraction
	for v := range to {
		n := to[v].Packets - from[v].Packets
		f.Offered += n
		if tiers.Verdict(v) != tiers.VerdictDrop {
			f.Passed += n
		}
	}
	return f
}

// weightsOf are the fractions of the span from stats from (at fromT) to
// to (at toT); severity says whether the policy has a severity block.
func weightsOf(from, to *bpf.Stats, fromT, toT time.Time, severity bool) Weights {
	w := Weights{From: fromT, To: toT, OverBudget: fractionOf(to.OverBudget, from.OverBudget)}
	for t := range to.Selected {
		f := fractionOf(to.Selected[t], from.Selected[t])
		w.All.Passed += f.Passed
		w.All.Offered += f.Offered
	}
	w.All.Passed += w.OverBudget.Passed
	w.All.Offered += w.OverBudget.Offered
	if severity {
		w.Classes = map[string]Fraction{}
		for _, c := range tiers.SeverityClasses {
			w.Classes[c.String()] = fractionOf(to.Severity[c], from.Severity[c])
		}
	}
	return w
}

// invSum is a group's samples that carry a pass probability q < 1, and
// their sum of 1 / (1 − q).
type invSum struct {
	n   uint64
	inv float64
}

// passEstimate estimates the pass fraction of a group's datagrams from
// its shed samples: each shed at pass probability q stands for 1 / (1 − q)
// judged ones (Horvitz–Thompson), so the fraction is 1 − n / Σ 1/(1 − q).
// The samples are a uniform draw of the shed packets (docs/design.md §10),
// so their rate cancels. Datagrams judged at q = 1 are never shed nor
// sampled, and are not in it. nil without a sample.
func (s invSum) passEstimate() *float64 {
	if s.n == 0 || s.inv <= 0 {
		return nil
	}
	v := max(0, 1-float64(s.n)/s.inv)
	return &v
}

// fmtFrac formats a fraction for a report: up to 6 significant digits.
func fmtFrac(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// weightParams are the report params of w and of the top groups'
// estimates: weights_from and weights_to, passed and offered,
// pass_frac (all), pass_frac_<class> and pass_frac_over_budget for what
// was offered, and pass_est_top ("group:fraction,...").
func weightParams(w *Weights, top []GroupShare) []sdParam {
	if w == nil {
		return nil
	}
	p := []sdParam{{"weights_from", w.From.UTC().Format(time.RFC3339Nano)}, {"weights_to", w.To.UTC().Format(time.RFC3339Nano)},
		{"passed", strconv.FormatUint(w.All.Passed, 10)}, {"offered", strconv.FormatUint(w.All.Offered, 10)},
		{"pass_frac", fmtFrac(w.All.Value())}}
	for _, c := range tiers.SeverityClasses {
		if f, ok := w.Classes[c.String()]; ok && f.Offered > 0 {
			p = append(p, sdParam{"pass_frac_" + c.String(), fmtFrac(f.Value())})
		}
	}
	if w.OverBudget.Offered > 0 {
		p = append(p, sdParam{"pass_frac_over_budget", fmtFrac(w.OverBudget.Value())})
	}
	var est []string
	for _, g := range top {
		if g.PassEst != nil {
			est = append(est, fmt.Sprintf("%s:%s", g.Group, fmtFrac(*g.PassEst)))
		}
	}
	if len(est) > 0 {
		p = append(p, sdParam{"pass_est_top", strings.Join(est, ",")})
	}
	return p
}
