package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// statusLicenseFleet prints the fleet's license day as its store holds it
// (docs/design.md §12, "One license for the fleet"): the day the store's
// clock is in, in the license's zone, the fleet's total against per_day
// and the pacing line, and each member's part, from the policy in config
// (fleet: and license:) and the store, with no agent running.
func statusLicenseFleet(ctx context.Context, w io.Writer, config string, asJSON bool) error {
	p, err := tiers.LoadFile(config)
	if err != nil {
		return configError{err}
	}
	if p.Fleet == nil || p.License == nil {
		return configError{fmt.Errorf("%s: status --license --config reads the fleet's license day from its store: the policy needs fleet: and license: (without --config it reads this host's license state file)", config)}
	}
	f := p.Fleet
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d, err := fleet.LicenseStatus(ctx, agent.FleetConfig(f, "status"), fleet.License{Day: agent.LicenseDay(p.License)})
	if err != nil {
		return storeError(err, f)
	}
	if asJSON {
		return writeLicenseFleetJSON(w, p, d)
	}
	return writeLicenseFleet(w, p, d)
}

// licenseFleetJSON is status --license --config F --json with fleet:.
type licenseFleetJSON struct {
	Fleet     string            `json:"fleet"`
	Store     string            `json:"store"`
	DayStart  time.Time         `json:"day_start"`
	DayEnd    time.Time         `json:"day_end"`
	StoreTime time.Time         `json:"store_time"`
	PerDay    uint64            `json:"per_day_bytes"`
	Spent     uint64            `json:"spent_bytes"`
	Pacing    uint64            `json:"pacing_bytes"` // per_day × the day gone: the pacing line now
	Members   []licenseMemberJS `json:"members"`
}

type licenseMemberJS struct {
	Name     string `json:"name"`
	Instance string `json:"instance"`
	Bytes    uint64 `json:"spent_bytes"`
}

// pacingLine is per_day × the part of d gone at its store time.
func pacingLine(perDay uint64, d fleet.LicenseDay) (bytes uint64, gone float64) {
	gone = float64(d.StoreTime.Sub(d.Start)) / float64(max(d.End.Sub(d.Start), 1))
	gone = min(max(gone, 0), 1)
	return uint64(float64(perDay) * gone), gone
}

func writeLicenseFleetJSON(w io.Writer, p tiers.Policy, d fleet.LicenseDay) error {
	pace, _ := pacingLine(p.License.PerDay, d)
	out := licenseFleetJSON{Fleet: p.Fleet.Name, Store: storeurl.Redact(p.Fleet.Store), DayStart: d.Start, DayEnd: d.End,
		StoreTime: d.StoreTime, PerDay: p.License.PerDay, Spent: d.Total, Pacing: pace, Members: []licenseMemberJS{}}
	for _, m := range d.Members {
		out.Members = append(out.Members, licenseMemberJS{m.Name, m.Instance, m.Bytes})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeLicenseFleet(w io.Writer, p tiers.Policy, d fleet.LicenseDay) error {
	loc := p.License.Zone
	if loc == nil {
		loc = time.UTC
	}
	per := p.License.PerDay
	pace, gone := pacingLine(per, d)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "license day\t%s to %s, on the store's clock (%s)\n", d.Start.In(loc).Format("2006-01-02 15:04 MST"),
		d.End.In(loc).Format("2006-01-02 15:04 MST"), d.StoreTime.In(loc).Format("15:04:05 MST"))
	fmt.Fprintf(tw, "spent\t%d of %d bytes (%.1f%%), the fleet %s's total in %s\n", d.Total, per, 100*float64(d.Total)/float64(max(per, 1)),
		p.Fleet.Name, storeurl.Redact(p.Fleet.Store))
	fmt.Fprintf(tw, "pacing line\t%d bytes by now (%.1f%% of the day gone)\n", pace, 100*gone)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(d.Members) == 0 {
		_, err := fmt.Fprintln(w, "no member has added to this day")
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tINSTANCE\tSPENT\tSHARE")
	for _, m := range d.Members {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f%%\n", m.Name, m.Instance, m.Bytes, 100*float64(m.Bytes)/float64(max(d.Total, 1)))
	}
	return tw.Flush()
}
