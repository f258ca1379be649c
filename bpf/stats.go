package bpf

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/tiers"
)

// The program's counters, read back: the per-CPU stats maps summed over
// CPUs into one Stats.

// Counter is a packet and byte count; bytes are L2 frame lengths.
type Counter struct {
	Packets uint64
	Bytes   uint64
}

func (c *Counter) add(s LimiterTlStat) {
	c.Packets += s.Packets
	c.Bytes += s.Bytes
}

// Stats are the program's counters summed over CPUs.
type Stats struct {
	// Selected is indexed by [tier][tiers.Verdict], tier 0..MaxTiers.
	Selected [MaxTiers + 1][NumVerdicts]Counter
	// Unselected counts packets passed without counting: not selected,
	// malformed, truncated or nested too deep.
	Unselected Counter
	// Exempt counts selected packets from exempt sources.
	Exempt Counter
	// FragmentPass and FragmentDrop count non-first fragments, which follow
	// the verdict of their first fragment.
	FragmentPass, FragmentDrop Counter
	// Severity counts selected UDP packets of policies with a severity
	// block by [tiers.SeverityClass][tiers.Verdict].
	Severity [tiers.NumSeverityClasses][NumVerdicts]Counter
	// ProtectedPass counts drop verdicts that protection turned into
	// passes; PaidDrop counts pass verdicts dropped to pay the debt.
	ProtectedPass, PaidDrop Counter
	// OverBudget counts selected packets over their source group's budget
	// by tiers.Verdict (pass under mode off); they are not in Selected.
	OverBudget [NumVerdicts]Counter
	// Malformed counts frames whose length fields disagree with the frame,
	// by reason (tiers.Malformed). They pass, but for tiny fragments in
	// enforce mode, which are dropped.
	Malformed [NumMalformed]Counter
	// Unclassified counts frames whose port the program cannot tell, by
	// reason (tiers.Unclassified): they are judged as selected, and are in
	// Selected (or Exempt) too.
	Unclassified [NumUnclassified]Counter
	// Payload counts the selected packets of Selected and OverBudget
	// together by tiers.Verdict, in other units: Packets are datagrams,
	// Bytes their L4 payload (what the collector's socket receives from
	// them; docs/design.md §2, §5), not their frames.
	Payload [NumVerdicts]Counter
	// TCPCounted counts, under count: bytes, the TCP segments of a syn
	// rule's connections that the window counts and never sheds (their
	// payload, as Payload); they are in no other counter.
	TCPCounted Counter
}

// PassedBytes is the L4 payload of the selected packets that passed (pass
// and would_drop verdicts, and TCPCounted): what count: bytes counts of
// them, and a SIEM meters.
func (s *Stats) PassedBytes() uint64 {
	return s.Payload[tiers.VerdictPass].Bytes + s.Payload[tiers.VerdictWouldDrop].Bytes + s.TCPCounted.Bytes
}

// SelectedTotal sums Selected over tiers for verdict v.
func (s *Stats) SelectedTotal(v tiers.Verdict) Counter {
	var c Counter
	for t := range s.Selected {
		c.Packets += s.Selected[t][v].Packets
		c.Bytes += s.Selected[t][v].Bytes
	}
	return c
}

// SelectedPackets sums Selected over tiers and verdicts: every selected
// packet counted in a window.
func (s *Stats) SelectedPackets() uint64 {
	var n uint64
	for _, v := range tiers.Verdicts {
		n += s.SelectedTotal(v).Packets
	}
	return n
}

// Stats reads and sums the per-CPU counters.
func (l *Limiter) Stats() (Stats, error) {
	var st Stats
	var per []LimiterTlStat
	for t := range st.Selected {
		for v := range NumVerdicts {
			if err := l.objs.Stats.Lookup(uint32(t*NumVerdicts+v), &per); err != nil {
				return Stats{}, fmt.Errorf("read stats[%d][%d]: %w", t, v, err)
			}
			for _, s := range per {
				st.Selected[t][v].add(s)
			}
		}
	}
	misc := [miscMax]*Counter{&st.Unselected, &st.Exempt, &st.FragmentPass, &st.FragmentDrop}
	if err := sumInto(l.objs.MiscStats, "misc_stats", misc[:]); err != nil {
		return Stats{}, err
	}
	sev := make([]*Counter, 0, sevStats)
	for c := range st.Severity {
		for v := range st.Severity[c] {
			sev = append(sev, &st.Severity[c][v])
		}
	}
	sev = append(sev, &st.ProtectedPass, &st.PaidDrop)
	if err := sumInto(l.objs.SeverityStats, "severity_stats", sev); err != nil {
		return Stats{}, err
	}
	if err := l.readOverBudget(&st); err != nil {
		return Stats{}, err
	}
	mal := make([]*Counter, len(st.Malformed))
	for i := range st.Malformed {
		mal[i] = &st.Malformed[i]
	}
	if err := sumInto(l.objs.MalformedStats, "malformed_stats", mal); err != nil {
		return Stats{}, err
	}
	uncl := make([]*Counter, len(st.Unclassified))
	for i := range st.Unclassified {
		uncl[i] = &st.Unclassified[i]
	}
	if err := sumInto(l.objs.UnclassifiedStats, "unclassified_stats", uncl); err != nil {
		return Stats{}, err
	}
	// An earlier layout's object (the tests' baselines) has no bytes_stats.
	pay := []*Counter{&st.Payload[0], &st.Payload[1], &st.Payload[2], &st.TCPCounted}
	if l.objs.BytesStats != nil {
		if err := sumInto(l.objs.BytesStats, "bytes_stats", pay); err != nil {
			return Stats{}, err
		}
	}
	return st, nil
}

// sumInto adds entry i of the per-CPU stats map m, summed over CPUs, to
// dst[i].
func sumInto(m *ebpf.Map, name string, dst []*Counter) error {
	var per []LimiterTlStat
	for i, c := range dst {
		if err := m.Lookup(uint32(i), &per); err != nil {
			return fmt.Errorf("read %s[%d]: %w", name, i, err)
		}
		for _, s := range per {
			c.add(s)
		}
	}
	return nil
}
