package main

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierlimit/tierlimit/tiers"
)

func init() { subcommands = append(subcommands, newCheckCmd) }

func newCheckCmd(g *globals) *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:   "check [--config F]",
		Short: "Validate a policy and print it compiled",
		Long: `check validates a policy file (YAML, or the seed's .properties) and prints the
compiled policy: each tier's packet range and drop rate, the table size and
its rounding, and the expected passed and dropped packets per window at
several offered loads. It names the shape; for smooth it prints the pass
rate the tiers allow at 0.5 to 10 × max and how the program estimates the
offered load. With a fleet, the tables are for fleet.max, and it prints the
fleet's pass rate and what one member passes of a share of it. With per-source budgets it states how they share the
capacity in-budget traffic leaves. Last, it names the CPU mitigations that
make the program's calls and returns pay a thunk on this host. Without
--config it checks the embedded default.

A bad policy is reported on one line, naming the key, the value and the line,
with exit code 2.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, source := tiers.Default(), "embedded default"
			if config != "" {
				var err error
				if p, err = tiers.LoadFile(config); err != nil {
					return configError{err}
				}
				source = config
			}
			t, err := tiers.Compile(p, 0)
			if err != nil {
				return configError{err}
			}
			warnEmptyTiers(g.logger(), t)
			return printCheck(g.stdout, source, p, t)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "policy file, YAML or .properties (default: the embedded default)")
	return cmd
}

// warnEmptyTiers logs the tiers that no packet can reach (tiers.EmptyTiers).
func warnEmptyTiers(log *slog.Logger, t tiers.Table) {
	for _, k := range tiers.EmptyTiers(t) {
		if k == 0 {
			log.Warn("tier 0 is empty: the first threshold is at most 1 packet", "threshold", t.Bounds[0])
			continue
		}
		log.Warn("tier is empty: its threshold floors to the next tier's", "tier", k, "threshold", t.Bounds[k])
	}
}

// checkLoads are the offered loads check prints, as multiples of max.
var checkLoads = []struct {
	name     string
	num, den uint64
}{{"0.5 × max", 1, 2}, {"1 × max", 1, 1}, {"2 × max", 2, 1}, {"10 × max", 10, 1}}

// printCheck writes the compiled policy as aligned tables.
func printCheck(out io.Writer, source string, p tiers.Policy, t tiers.Table) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "policy\t%s: valid\n", source)
	fmt.Fprintf(w, "mode\t%s\n", p.Mode)
	fmt.Fprintf(w, "window\t%s\n", p.Window)
	fmt.Fprintf(w, "shape\t%s\n", shapeSummary(p.Shape))
	printCount(w, p)
	if p.Auto != nil {
		printAuto(w, *p.Auto, p.Count)
	} else {
		fmt.Fprintf(w, "max\t%s per window\n", amount(p.Count, p.Max))
	}
	if p.Fleet != nil {
		fmt.Fprintf(w, "fleet.max\t%s per window for the whole fleet: the tables below are for it (max is this host's own, for the fallback)\n", amount(p.Count, p.Fleet.Max))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	parts := []func(io.Writer, tiers.Policy, tiers.Table) error{printTiers, printTable, printExpected, printSelect}
	if p.Shape == tiers.ShapeSmooth {
		parts = slices.Insert(parts, 3, printSmooth)
	}
	for _, part := range parts {
		fmt.Fprintln(out)
		if err := part(out, p, t); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "\nexempt sources: %s\n", prefixes(p.Exempt, "none"))
	printSourcesCheck(out, p, t)
	printSeverityCheck(out, p, t)
	printRecordCheck(out, p)
	if err := printFleetCheck(out, p, t); err != nil {
		return err
	}
	if err := printLicenseCheck(out, p, time.Now()); err != nil {
		return err
	}
	printCPUCheck(out, hostRoot)
	return nil
}

// amount words n of what a policy counting c counts: "40000 selected
// packets", or "10000000 bytes (10 MB) of syslog payload" under count:
// bytes.
func amount(c tiers.Count, n uint64) string {
	if c == tiers.CountBytes {
		return fmt.Sprintf("%d bytes (%s) of syslog payload", n, tiers.FormatSize(n))
	}
	return fmt.Sprintf("%d selected packets", n)
}

// printCount prints what the window counts (docs/design.md §2), and under
// count: bytes how TCP counts.
func printCount(w io.Writer, p tiers.Policy) {
	if p.Count != tiers.CountBytes {
		fmt.Fprintf(w, "count\tpackets: each selected datagram (and TCP SYN, or segment under a count: packets rule) counts 1\n")
		return
	}
	fmt.Fprintf(w, "count\tbytes: each selected UDP datagram weighs its payload (UDP length - 8: what the collector's socket receives); max, the tiers, the budgets and the fleet's sums are bytes\n")
	for _, r := range p.Select {
		if r.Proto != tiers.ProtoTCP {
			continue
		}
		if r.Count == tiers.CountSYN {
			fmt.Fprintf(w, "tcp\t%s: SYNs are judged at the window's bytes (a SYN weighs its payload, 0); every other segment's payload is counted in the window and never shed\n", r)
		} else {
			fmt.Fprintf(w, "tcp\t%s: every segment is judged, weighing its TCP payload\n", r)
		}
	}
}

// printRecordCheck prints the shed record and where episodes are reported
// (docs/design.md §10).
func printRecordCheck(out io.Writer, p tiers.Policy) {
	r := p.Record
	switch {
	case r.Samples == 0:
		fmt.Fprintf(out, "\nshed record: off (record.samples 0)\n")
	case r.Dir == "":
		fmt.Fprintf(out, "\nshed record: at most %d samples/s of shed packets, %d bytes each, in the agent's memory (no record.dir)\n", r.Samples, r.Snaplen)
	default:
		fmt.Fprintf(out, "\nshed record: at most %d samples/s of shed packets, %d bytes each, as pcapng in %s within %d bytes\n", r.Samples, r.Snaplen, r.Dir, r.MaxBytes)
	}
	dest := "the agent's log only (no events.syslog)"
	if s := p.Events.Syslog(); s != "" {
		dest = s + " (RFC 5424) and the agent's log"
	}
	fmt.Fprintf(out, "episode reports: %s; a summary every %s\n", dest, p.Events.SummaryEvery)
}

// printTiers prints each tier's at, packet range and drop, and where a
// coarse table makes the tier start.
func printTiers(out io.Writer, p tiers.Policy, t tiers.Table) error {
	rounded := t.Shift > 0
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "TIER\tAT\t%s n\tDROP", strings.ToUpper(p.Count.Unit()))
	if rounded {
		fmt.Fprint(w, "\tTABLE FROM n")
	}
	fmt.Fprintln(w)
	K := len(t.Bounds)
	for k := 0; k <= K; k++ {
		at, drop, from := "-", "0%", uint64(1)
		if k > 0 {
			at, drop, from = p.Tiers[k-1].At.String(), p.Tiers[k-1].Drop.String(), t.Bounds[k-1]
		}
		rng := fmt.Sprintf("[%d, ∞)", from)
		if k < K {
			rng = fmt.Sprintf("[%d, %d)", from, t.Bounds[k])
			if t.Bounds[k] <= from {
				rng += " empty"
			}
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s", k, at, rng, drop)
		if rounded {
			fmt.Fprintf(w, "\t%d", t.TierStart(k))
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}

// printTable prints the table's size, step and rounding.
func printTable(out io.Writer, p tiers.Policy, t tiers.Table) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	unit := p.Count.Unit()
	switch {
	case t.Shift == 0:
		fmt.Fprintf(w, "table\t%d entries, step 1 %s\trounding: exact\n", t.Len(), strings.TrimSuffix(unit, "s"))
	case t.MaxRoundingError == 0:
		fmt.Fprintf(w, "table\t%d entries, step %d %s (n >> %d)\trounding: exact, every threshold is a multiple of the step\n",
			t.Len(), uint64(1)<<t.Shift, unit, t.Shift)
	default:
		fmt.Fprintf(w, "table\t%d entries, step %d %s (n >> %d)\trounding: tier boundaries move later by at most %d %s\n",
			t.Len(), uint64(1)<<t.Shift, unit, t.Shift, t.MaxRoundingError, unit)
	}
	return w.Flush()
}

// printExpected prints the expected passed and dropped packets per window
// at the checkLoads.
func printExpected(out io.Writer, p tiers.Policy, t tiers.Table) error {
	switch p.Mode {
	case tiers.ModeDryRun:
		fmt.Fprintln(out, "expected per window (mode dry-run: nothing is dropped; DROPPED is counted as would_drop)")
	case tiers.ModeOff:
		fmt.Fprintln(out, "expected per window (mode off: nothing is dropped; as if mode were enforce)")
	default:
		fmt.Fprintln(out, "expected per window")
	}
	if p.Count == tiers.CountBytes {
		fmt.Fprintln(out, "(in bytes: n, PASSED and DROPPED are bytes of payload; ± σ is for 1-byte datagrams, and grows with √ of their size)")
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "OFFERED\tn\tPASSED\t± σ\tDROPPED\tDROP %\t")
	for _, l := range checkLoads {
		offered := p.TableMax() * l.num / l.den
		e := t.Expected(offered)
		ratio := 0.0
		if offered > 0 {
			ratio = 100 * e.Dropped / float64(offered)
		}
		fmt.Fprintf(w, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f%%\t\n", l.name, offered, e.Passed, math.Sqrt(e.Variance), e.Dropped, ratio)
	}
	return w.Flush()
}

// printSelect prints the select rules.
func printSelect(out io.Writer, p tiers.Policy, _ tiers.Table) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SELECT\tPROTO\tPORTS\tCOUNT\tDESTS")
	for i, r := range p.Select {
		dests := prefixes(r.Dests, "any")
		if r.Local {
			// The host's own addresses, which run reads and follows.
			dests = "local"
			if len(r.Dests) > 0 {
				dests += ", " + prefixes(r.Dests, "")
			}
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", i, r.Proto, r.PortsString(), r.Count, dests)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(out, encapNote)
	return err
}

// encapNote is what check says of encapsulated traffic, which the program
// does not parse (issue 35 B56).
const encapNote = "encapsulated traffic is not parsed: IPIP, IPv6-in-IPv4, GRE, GUE and VXLAN packets are judged by their outer headers only\n" +
	"(IPIP passes uncounted), so a collector behind an encapsulating balancer (Katran, IPVS-TUN) is not protected on the NIC that\n" +
	"receives the tunnel; a decapsulating device has no Ethernet header and is refused as an --iface"

// prefixes lists ps with each one's family, which is the only family it
// matches (docs/design.md §2), or none when there are none.
func prefixes(ps []netip.Prefix, none string) string {
	if len(ps) == 0 {
		return none
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		fam := "IPv6"
		if p.Addr().Is4() {
			fam = "IPv4"
		}
		s[i] = p.String() + " (" + fam + ")"
	}
	return strings.Join(s, ", ")
}
