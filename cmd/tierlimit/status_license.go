package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tierlimit/tierlimit/agent/license"
)

// countTrue counts the flags set.
func countTrue(flags ...bool) int {
	n := 0
	for _, f := range flags {
		if f {
			n++
		}
	}
	return n
}

// statusLicense prints the license state at path (docs/design.md §13):
// the day, its spend, the projection by its end at the recent rate (as
// of now, from the rate the agent last saved), and the pacing, with no
// agent running. A state of another day says so: nothing is spent today
// that the file knows of.
func statusLicense(w io.Writer, path string, asJSON bool, now time.Time) error {
	s, err := license.ReadState(path)
	if err != nil {
		return fmt.Errorf("license state: %w (the agent keeps it when its policy has license:, beside --state-file)", err)
	}
	left := max(s.DayEnd.Sub(now), 0)
	today := !now.Before(s.DayStart) && now.Before(s.DayEnd)
	proj := s.Spent + uint64(s.Rate*left.Seconds())
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			license.State
			Today     bool   `json:"today"`
			Projected uint64 `json:"projected"`
		}{s, today, proj})
	}
	loc, err := time.LoadLocation(s.Zone)
	if err != nil {
		loc = time.UTC
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	day := fmt.Sprintf("%s to %s", s.DayStart.In(loc).Format("2006-01-02 15:04 MST"), s.DayEnd.In(loc).Format("2006-01-02 15:04 MST"))
	if !today {
		day += " (not today's: the agent has not written today's state)"
	}
	fmt.Fprintf(tw, "license day\t%s\n", day)
	fmt.Fprintf(tw, "spent\t%d of %d bytes (%.1f%%)", s.Spent, s.PerDay, 100*float64(s.Spent)/float64(max(s.PerDay, 1)))
	if s.Members > 0 {
		fmt.Fprintf(tw, ", the fleet's total (%d members)", s.Members)
	}
	fmt.Fprintln(tw)
	if today {
		fmt.Fprintf(tw, "projected\t%d bytes by the day's end (%.1f%%) at %.0f bytes/s\n", proj, 100*float64(proj)/float64(max(s.PerDay, 1)), s.Rate)
		gone := now.Sub(s.DayStart)
		pace := float64(s.PerDay) * float64(gone) / float64(s.DayEnd.Sub(s.DayStart))
		fmt.Fprintf(tw, "pacing line\t%.0f bytes by now (%.1f%% of the day gone)\n", pace, 100*float64(gone)/float64(s.DayEnd.Sub(s.DayStart)))
	}
	fmt.Fprintf(tw, "window\t%s: target %d bytes, budget (max) %d bytes\n", s.Window, s.Target, s.Max)
	fmt.Fprintf(tw, "saved\t%s (%s ago)\n", s.Saved.In(loc).Format(time.RFC3339), now.Sub(s.Saved).Round(time.Second))
	return tw.Flush()
}
