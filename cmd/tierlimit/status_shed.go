package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/tiers"
)

// statusShed prints the episode in the agent's state file (docs/design.md §10).
func statusShed(w io.Writer, path string, asJSON bool) error {
	ep, err := record.ReadEpisode(path)
	if errors.Is(err, fs.ErrNotExist) {
		if asJSON {
			_, err := fmt.Fprintln(w, "null")
			return err
		}
		_, err := fmt.Fprintf(w, "no shedding episode recorded (%s does not exist: no episode since the agent's state was created, or run uses another --state-file)\n", path)
		return err
	}
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(ep)
	}
	return writeEpisode(w, ep, time.Now())
}

func writeEpisode(w io.Writer, ep record.Episode, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	state := "closed"
	if ep.Open {
		state = "open"
	}
	fmt.Fprintf(tw, "episode\t%d (%s)\n", ep.ID, state)
	fmt.Fprintf(tw, "began\t%s\n", ep.Start.Local().Format(time.RFC3339))
	if !ep.Open {
		fmt.Fprintf(tw, "ended\t%s\n", ep.End.Local().Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "duration\t%s\n", ep.Duration(now).Round(time.Second))
	fmt.Fprintf(tw, "interfaces\t%v\n", ep.Interfaces)
	of := ""
	if ep.MaxOf != "" {
		of = ": " + ep.MaxOf // the fleet's, not the policy's own
	}
	fmt.Fprintf(tw, "mode\t%s (max %d per window%s)\n", ep.Mode, ep.Max, of)
	fmt.Fprintf(tw, "offered\t%.0f selected packets/s at the start, peak %.0f\n", ep.OfferedRate, ep.PeakRate)
	fmt.Fprintf(tw, "shed\t%d packets\n", ep.Shed)
	for _, c := range []struct {
		name string
		m    map[string]uint64
	}{{"by tier", ep.ByTier}, {"by reason", ep.ByReason}, {"by severity", ep.BySeverity}} {
		if len(c.m) == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s\t", c.name)
		for i, k := range slices.Sorted(maps.Keys(c.m)) {
			if i > 0 {
				fmt.Fprint(tw, ", ")
			}
			fmt.Fprintf(tw, "%s: %d", k, c.m[k])
		}
		fmt.Fprintln(tw)
	}
	if wt := ep.Weights; wt != nil {
		fmt.Fprintf(tw, "weights	%s to %s: passed %d of %d (pass_frac %s, weight %s)", wt.From.Local().Format(time.TimeOnly),
			wt.To.Local().Format(time.TimeOnly), wt.All.Passed, wt.All.Offered, fmtShare(wt.All.Value()), fmtShare(wt.All.Weight()))
		for _, c := range tiers.SeverityClasses {
			if f, ok := wt.Classes[c.String()]; ok && f.Offered > 0 {
				fmt.Fprintf(tw, "; %s %s", c, fmtShare(f.Value()))
			}
		}
		if wt.OverBudget.Offered > 0 {
			fmt.Fprintf(tw, "; over budget %s", fmtShare(wt.OverBudget.Value()))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ep.Top) == 0 {
		_, err := fmt.Fprintf(w, "\ntop source groups: none sampled (%d samples)\n", ep.Samples)
		return err
	}
	fmt.Fprintf(w, "\ntop source groups by sampled sheds (%d samples):\n", ep.Samples)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSAMPLES\tSHARE\tPASS (EST.)")
	for _, g := range ep.Top {
		est := "-"
		if g.PassEst != nil {
			est = fmtShare(*g.PassEst)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%s\n", g.Group, g.Samples, 100*g.Share, est)
	}
	return tw.Flush()
}

// fmtShare formats a pass fraction or a weight: up to 4 significant digits.
func fmtShare(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
