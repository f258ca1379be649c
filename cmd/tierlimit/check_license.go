package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// licenseLoads are the offered rates check plans the day at, as
// multiples of the day's average rate (per_day ÷ the day's length).
var licenseLoads = []struct {
	name     string
	num, den uint64
}{{"0.5 × avg", 1, 2}, {"1 × avg", 1, 1}, {"2 × avg", 2, 1}}

// licenseSteps is how many steps check's plan walks a day in: the law
// paced at each step (30 s of a 24 h day), as the agent paces each window.
const licenseSteps = 2880

// printLicenseCheck prints the license (docs/design.md §13) and the day's
// plan: at 0.5, 1 and 2 × the day's average rate, the byte budget per
// window at the day's start (the target the law paces and the max it
// compiles), when the license runs out without the guard and when with
// it, in clock time in the license's zone, for today's license day.
func printLicenseCheck(out io.Writer, p tiers.Policy, now time.Time) error {
	l := p.License
	if l == nil {
		return nil
	}
	day := l.DayOf(now)
	avg := l.Average(day, p.Window)
	fmt.Fprintf(out, "\nlicense: %s\n", l)
	fmt.Fprintf(out, "today's license day: %s to %s (%s); its average rate %d bytes per window of %s\n",
		day.Start.Format("2006-01-02 15:04 MST"), day.End.Format("2006-01-02 15:04 MST"), day.Len(), avg, p.Window)
	if c := l.BurstCap(day); c > 0 {
		fmt.Fprintf(out, "burst cap: at most %d bytes in any %s\n", c, l.Burst.Window)
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "OFFERED\tBYTES/WINDOW\tTARGET/WINDOW\tMAX/WINDOW\tUNPACED: SPENT AT\tPACED: SPENT AT\tPACED: PASSED BY DAY'S END")
	for _, ld := range licenseLoads {
		r := avg * ld.num / ld.den
		first := l.Pace(tiers.PaceInput{Day: day, Now: day.Start, Window: p.Window, Offered: r, Tiers: p.Tiers})
		unpaced := "never (under per_day)"
		if pass := tiers.LicensePassed(p.Tiers, float64(p.Max), float64(r)); pass > 0 {
			if d := time.Duration(float64(l.PerDay) / pass * float64(p.Window)); d < day.Len() {
				unpaced = day.Start.Add(d).Format("15:04 MST")
			}
		}
		out, at := planDay(l, p, day, r)
		paced := "not spent"
		if !at.IsZero() {
			paced = at.Format("15:04 MST")
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t%.1f%% of per_day\n", ld.name, r, first.Target, first.Max, unpaced, paced,
			100*out/float64(l.PerDay))
	}
	fmt.Fprintln(w, "(unpaced: at the policy's max without the license; paced: the law walked over the day in 30 s steps of a 24 h day, each step's passes the tiers' expectation; the day's spend is at most per_day, the last step's rounding aside)")
	return w.Flush()
}

// planDay walks day at offered r bytes per window under the pacing law
// and returns the bytes passed by its end and when the spend reached
// per_day (zero when it did not before the end).
func planDay(l *tiers.License, p tiers.Policy, day tiers.LicenseDay, r uint64) (float64, time.Time) {
	step := day.Len() / licenseSteps
	scale := float64(step) / float64(p.Window)
	var spent float64
	var at time.Time
	for now := day.Start; now.Before(day.End); now = now.Add(step) {
		pc := l.Pace(tiers.PaceInput{Day: day, Now: now, Window: step, Spent: uint64(spent), Offered: uint64(float64(r) * scale), Tiers: p.Tiers})
		m := float64(pc.Max)
		if pc.Target == 0 && pc.Floor == 0 {
			m = 0
		}
		spent += min(tiers.LicensePassed(p.Tiers, m, float64(r)*scale), float64(r)*scale)
		if at.IsZero() && spent >= float64(l.PerDay)*0.999 {
			at = now.Add(step)
		}
	}
	return spent, at
}
