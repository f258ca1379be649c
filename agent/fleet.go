package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/tiers"
)

// fleetState is the agent's side of the fleet controller (docs/design.md
// §12); guarded by applyMu, except c, which StartFleet sets once (a
// scrape reads it without waiting for a reload), and bound, which the
// controller's reports read.
type fleetState struct {
	log *slog.Logger

	c       atomic.Pointer[fleet.Controller]
	member  string // as StartFleet was given it
	started bool   // StartFleet ran: the fold follows the policy in force
	// in and members say whether the controller put the agent in
	// fallback, and with which member count (tiers.State).
	in      bool
	members int
	// last is fallback last's share as the controller last told it
	// (fleet.Viewer), 0 once decayed or for the other fallbacks.
	last uint64
	// bound is the fold for max: auto that the controller's reports
	// read (fleet.Config.Bound); tables what it was last set to, nil
	// without auto.
	bound  fleet.AutoBound
	tables *fleetTables

	// instanceFile is where the controller keeps its instance id across
	// restarts (FleetMember.InstanceFile); "" for none.
	instanceFile string
	// ledger is the license guard (StartLicense) as the controller's
	// fleet.LicenseLedger, nil when none runs: with a policy that has
	// license: the day's spend is the fleet's (docs/design.md §12, "One
	// license for the fleet").
	ledger fleet.LicenseLedger
}

// fleetTables is what a member with max: auto folds into the others' sums at
// each report (tiers.FleetOthersWithAuto): the table for fleet.max and the
// one for its learnt max.
type fleetTables struct {
	max          uint64 // the learnt max local was compiled for
	fleet, local tiers.Table
}

// FleetConfig is the controller's view of p's fleet block; member names
// this member in the store ("" for the host name).
func FleetConfig(f *tiers.Fleet, member string) fleet.Config {
	return fleet.Config{
		Name: f.Name, Member: member, Store: f.Store, PasswordFile: f.PasswordFile, CAFile: f.CAFile,
		CertFile: f.CertFile, KeyFile: f.KeyFile, ServerName: f.ServerName,
		SentinelPasswordFile: f.SentinelPasswordFile, SentinelUser: f.SentinelUser,
		Max: f.Max, Report: f.Report, TTL: f.TTL, Fallback: f.Fallback.String(),
	}
}

// StartFleet starts the fleet controller for p, the policy New or the
// last reload applied, when it has a fleet block: the controller reads the
// program's estimate and writes the others' sum every fleet.report, and
// switches the agent to p's fallback policy (tiers.Policy.FleetFallbackPolicy)
// while the store is out of reach. Close stops it and leaves the fleet.
// It returns nil, nil when p has no fleet.
//
// With license: beside fleet: and a license guard started before
// (StartLicense), the guard is the controller's fleet.LicenseLedger: each
// report adds this member's passed bytes to the fleet's day in the store
// and hands the guard the fleet's total (docs/design.md §12, "One license
// for the fleet"); a reload that adds, changes or removes license: takes
// effect at the next report.
//
// With max: auto (docs/design.md §12) the member never passes more than
// its learnt max allows on its own R̂: at each report the controller
// writes tiers.FleetOthersWithAuto(fleet table, learnt max's table, own
// R̂_in and R̂_tot, others' sums) in place of the sums (fleet.Config.Bound), the learnt
// max's table compiled again only when the auto controller changes the
// max; in fallback the max is the smaller of the fallback's and the
// learnt one.
//
// Its errors are fleet.Start's (cmd maps each to exit 2, naming the key):
// fleet.ErrPasswordFile, fleet.ErrSentinelPasswordFile, fleet.ErrCAFile,
// fleet.ErrCertFile, fleet.ErrStoreURL, fleet.ErrConfig. A store out of
// reach, or one that refuses the credentials, is no error: the agent
// starts in fallback, limiting, and joins once the store answers (a
// refusal is an ERROR and fleet_auth_failed until then).
func (a *Agent) StartFleet(p tiers.Policy, m FleetMember) (*fleet.Controller, error) {
	if p.Fleet == nil {
		return nil, nil
	}
	if a.closed.Load() {
		return nil, errClosed
	}
	a.applyMu.Lock()
	if a.fleet.c.Load() != nil {
		a.applyMu.Unlock()
		return nil, errors.New("fleet: a controller runs already")
	}
	a.fleet.member, a.fleet.instanceFile, a.fleet.started = m.Name, m.InstanceFile, true
	if g := a.lic.Load(); g != nil {
		a.fleet.ledger = g
	}
	a.fleet.boundFor(tiers.State{LearntMax: a.auto.Load().Learnt(p)}.Learnt(p), a.local, true)
	a.applyMu.Unlock()
	c, err := fleet.Start(a.fleet.config(p), a.lim, (*fleetSide)(a), a.log)
	if err != nil {
		return nil, fmt.Errorf("fleet %s: %w", p.Fleet.Name, err)
	}
	a.fleet.c.Store(c)
	return c, nil
}

// config is FleetConfig for the agent's member, with the fold of
// max: auto as its Bound, the settings the members compare (the window
// and the table's digest, docs/design.md §12, Agreement), the instance
// file and, when p has license: and a guard runs, the license.
func (f *fleetState) config(p tiers.Policy) fleet.Config {
	cfg := FleetConfig(p.Fleet, f.member)
	cfg.Bound = f.bound.Fold
	cfg.Window, cfg.Digest = p.Window, p.FleetDigest()
	cfg.InstanceFile = f.instanceFile
	if p.License != nil && f.ledger != nil {
		cfg.License = &fleet.License{Ledger: f.ledger, Day: LicenseDay(p.License)}
	}
	return cfg
}

// LicenseDay is l's day as fleet.License.Day takes it: the license day
// that holds t on the store's clock (tiers.License.DayOf, in the
// license's zone), named by its start.
func LicenseDay(l *tiers.License) func(time.Time) (start, end, named time.Time) {
	return func(t time.Time) (time.Time, time.Time, time.Time) {
		d := l.DayOf(t)
		return d.Start, d.End, d.Start
	}
}

// FleetMember names this agent in its fleet: Name its member name in the
// store (docs/design.md §12; the host name unless run --fleet-member),
// InstanceFile where the controller keeps this host's instance id across
// restarts (fleet.Config.InstanceFile), so that a restarted agent replaces
// its earlier instance in the store at once (§12, Identity); "" keeps
// none. cmd sets FleetInstanceFile of the state file.
type FleetMember struct {
	Name         string
	InstanceFile string
}

// FleetInstanceFile is the instance file beside the agent's state file
// statePath (DefaultStatePath): fleet-instance in its directory for the
// default episode.json, fleet-instance@<pin path> for an
// episode@<pin path>.json, else statePath with .fleet-instance added; ""
// when statePath is "".
func FleetInstanceFile(statePath string) string {
	if statePath == "" {
		return ""
	}
	dir, base := filepath.Split(statePath)
	if rest, ok := strings.CutPrefix(strings.TrimSuffix(base, ".json"), "episode"); ok && (rest == "" || rest[0] == '@') {
		return filepath.Join(dir, "fleet-instance"+rest)
	}
	return statePath + ".fleet-instance"
}

// boundFor sets the fold's tables for p, the fleet's policy at the
// learnt max (tiers.State.Learnt), with the host's destinations local
// (applyMu held): none without max: auto; the learnt max's table compiled
// again when the max changed, the fleet's too when fleetChanged (a new
// policy). A table that does not compile leaves the last in place,
// logged.
func (f *fleetState) boundFor(p tiers.Policy, local []tiers.LocalDest, fleetChanged bool) {
	if p.Fleet == nil || p.Auto == nil {
		f.tables = nil
		f.bound.Clear()
		return
	}
	old := f.tables
	if old != nil && !fleetChanged && old.max == p.Max {
		return
	}
	b := &fleetTables{max: p.Max}
	var err error
	if old != nil && !fleetChanged {
		b.fleet = old.fleet
	} else if b.fleet, err = tiers.Compile(p.WithLocal(local), 0); err != nil {
		f.log.Error("fleet: compile the fleet's table for max: auto; the last stays", "err", err)
		return
	}
	if b.local, err = tiers.Compile(p.Local().WithLocal(local), 0); err != nil {
		f.log.Error("fleet: compile the learnt max's table; the last stays", "max", p.Max, "err", err)
		return
	}
	f.tables = b
	f.bound.Set(b.fleet, b.local)
}

// follow takes p, the fleet's policy in force at the learnt max, once
// applied again (applyMu held): with max: auto and a new learnt max, the
// fold's table for that max.
func (f *fleetState) follow(p tiers.Policy, local []tiers.LocalDest) {
	if f.started && p.Fleet != nil {
		f.boundFor(p, local, false)
	}
}

// Fleet returns the fleet controller, or nil when none runs.
func (a *Agent) Fleet() *fleet.Controller { return a.fleet.c.Load() }

// fleetSide is the agent as the controller's fleet.Fallback.
type fleetSide Agent

// EnterFallback applies the fallback policy of the fleet's policy.
func (s *fleetSide) EnterFallback(members int) error {
	a := (*Agent)(s)
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	a.fleet.in, a.fleet.members = true, members
	if a.closed.Load() {
		return errClosed
	}
	return a.apply(context.Background(), a.given, inForce{a}) // in fallback: tiers.Effective's
}

// LeaveFallback applies the fleet's policy again.
func (s *fleetSide) LeaveFallback() error {
	a := (*Agent)(s)
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	a.fleet.in = false
	if a.closed.Load() {
		return errClosed
	}
	return a.apply(context.Background(), a.given, inForce{a})
}

// reloaded tells the controller that a reload applied a new policy, p
// at the learnt max (applyMu held): it reads password_file again and
// takes the new report, ttl and fallback, and the fold its tables. A
// fleet removed, or one that names another store or fleet, takes a
// restart of the agent; the log says so.
func (f *fleetState) reloaded(p tiers.Policy, local []tiers.LocalDest) {
	c := f.c.Load()
	if c == nil {
		return
	}
	if p.Fleet == nil {
		f.log.Warn("fleet: the reloaded policy has no fleet block; the controller goes on until the agent restarts")
		return
	}
	f.boundFor(p, local, true)
	if err := c.Reload(f.config(p)); errors.Is(err, fleet.ErrRestart) {
		f.log.Warn("fleet: the reloaded policy names another fleet or store; restart the agent to join it", "fleet", p.Fleet.Name)
	} else if err != nil {
		f.log.Error("fleet: reload", "err", err)
	}
}

// stop stops the controller and leaves the fleet, before Close takes
// applyMu: the controller's loop may wait for it in EnterFallback.
func (f *fleetState) stop() {
	c := f.c.Load()
	if c == nil {
		return
	}
	if err := c.Close(); err != nil {
		f.log.Warn("fleet: leave", "err", err)
	}
}

// fleetCollector exports the fleet controller's metrics while one runs.
type fleetCollector struct{ a *Agent }

func (f fleetCollector) Describe(ch chan<- *prometheus.Desc) { fleet.Describe(ch) }

func (f fleetCollector) Collect(ch chan<- prometheus.Metric) {
	if c := f.a.Fleet(); c != nil {
		c.Collect(ch)
	}
}
