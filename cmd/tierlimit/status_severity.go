package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/tiers"
)

// severityJSON is the --json shape of severity-aware shedding; absent when
// the policy has no severity block.
type severityJSON struct {
	ProtectBudget uint64                       `json:"protect_budget_packets"`
	Classes       map[string][]string          `json:"classes"`
	Facilities    []string                     `json:"protected_facilities,omitempty"`
	Packets       map[string]map[string]uint64 `json:"packets"`
	ProtectedPass uint64                       `json:"protected_passed_packets"`
	DebtPaid      uint64                       `json:"debt_paid_packets"`
	DropDebt      uint64                       `json:"drop_debt_packets"`
}

func severityStatus(st agent.Status) *severityJSON {
	sv := st.Policy.Severity
	if !sv.On {
		return nil
	}
	out := &severityJSON{
		ProtectBudget: sv.ProtectBudget,
		Classes:       map[string][]string{},
		Packets:       map[string]map[string]uint64{},
		ProtectedPass: st.Stats.ProtectedPass.Packets,
		DebtPaid:      st.Stats.PaidDrop.Packets,
		DropDebt:      st.DropDebt,
	}
	for sev, c := range sv.Class {
		if c != tiers.SevNormal {
			out.Classes[c.String()] = append(out.Classes[c.String()], tiers.SeverityName(sev))
		}
	}
	out.Facilities = facilityNames(sv.Facilities)
	for _, c := range tiers.SeverityClasses {
		out.Packets[c.String()] = map[string]uint64{}
		for _, v := range tiers.Verdicts {
			out.Packets[c.String()][v.String()] = st.Stats.Severity[c][v].Packets
		}
	}
	return out
}

// writeSeverityStatus prints the severity block's counters, if the policy
// has one.
func writeSeverityStatus(w io.Writer, st agent.Status) {
	s := severityStatus(st)
	if s == nil {
		return
	}
	fmt.Fprintf(w, "\nseverity (UDP): protected %v, shed first %v, protect budget %d packets per window\n",
		s.Classes[tiers.SevProtected.String()], s.Classes[tiers.SevShedFirst.String()], s.ProtectBudget)
	if len(s.Facilities) > 0 {
		fmt.Fprintf(w, "protected facilities (whatever the severity): %v\n", s.Facilities)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "class\tpass\tdrop\twould_drop\t")
	for _, c := range tiers.SeverityClasses {
		p := s.Packets[c.String()]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t\n", c, p["pass"], p["drop"], p["would_drop"])
	}
	tw.Flush()
	fmt.Fprintf(w, "protected passes %d, debt paid %d, current drop debt %d\n", s.ProtectedPass, s.DebtPaid, s.DropDebt)
}

// printSeverityCheck describes the severity block for `tierlimit check`:
// the classes, the budget in packets, what shed-first does in each tier,
// and that TCP rules are not affected.
func printSeverityCheck(out io.Writer, p tiers.Policy, t tiers.Table) {
	if p.Severity == nil {
		fmt.Fprintln(out, "\nseverity: off (every selected datagram is judged alike)")
		return
	}
	sv := t.Severity
	fmt.Fprintf(out, "\nseverity (UDP syslog <PRI>, RFC 5424 §6.2.1): %s\n", p.Severity)
	fmt.Fprintf(out, "  protected datagrams pass a drop verdict while the window's drop debt is under %d packets;\n", sv.ProtectBudget)
	fmt.Fprintln(out, "  unprotected ones that would pass are dropped while the debt is positive, paying it off.")
	fmt.Fprintf(out, "  the collector gets at most %d packets per window more than the tiers give.\n", sv.ProtectBudget)
	if sv.Facilities != 0 {
		fmt.Fprintf(out, "  protected facilities (PRI / 8, whatever the severity, even a shed-first one): %s\n", facilityList(sv.Facilities))
	}
	for k := 1; k < len(sv.ShedDrops); k++ {
		fmt.Fprintf(out, "  shed first in tier %d: drop %s%%\n", k, pct(tiers.DropRatio(sv.ShedDrops[k])))
	}
	for _, r := range p.Select {
		if r.Proto == tiers.ProtoTCP {
			fmt.Fprintln(out, "  note: severity applies to udp rules only; tcp rules count connection attempts, which carry no message")
			break
		}
	}
}

// facilityNames names the facilities of mask (bit f: facility f).
func facilityNames(mask uint32) []string {
	var out []string
	for f := range tiers.NumFacilities {
		if mask>>f&1 != 0 {
			out = append(out, tiers.FacilityName(f))
		}
	}
	return out
}

// facilityList is "auth (4), authpriv (10)": names and numbers of mask.
func facilityList(mask uint32) string {
	var out []string
	for f := range tiers.NumFacilities {
		if mask>>f&1 != 0 {
			out = append(out, fmt.Sprintf("%s (%d)", tiers.FacilityName(f), f))
		}
	}
	return strings.Join(out, ", ")
}

func pct(ratio float64) string {
	return fmt.Sprintf("%.6g", 100*ratio)
}
