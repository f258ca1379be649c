package agent

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/tiers"
)

// fleetState is the agent's side of the fleet controller (docs/design.md
// §12); guarded by applyMu, except c, which StartFleet sets once (a
// scrape reads it without waiting for a reload).
type fleetState struct {
	c      atomic.Pointer[fleet.Controller]
	member string // as StartFleet was given it
	// given is the policy with its fleet as last given (New, a reload);
	// in and members say whether the controller put the agent in
	// fallback, and with which member count.
	given   tiers.Policy
	in      bool
	members int
}

// ErrFleetAuto: StartFleet refuses a fleet with max: auto, which this
// agent does not combine yet (the fold of docs/design.md §12, "With max:
// auto").
var ErrFleetAuto = errors.New("fleet with max: auto is not supported by this agent yet")

// FleetConfig is the controller's view of p's fleet block; member names
// this member in the store ("" for the host name).
func FleetConfig(f *tiers.Fleet, member string) fleet.Config {
	return fleet.Config{
		Name: f.Name, Member: member, Store: f.Store, PasswordFile: f.PasswordFile, CAFile: f.CAFile,
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
// Its errors are fleet.Start's: fleet.ErrAuth when the store refuses the
// password (cmd maps it to exit 2, naming password_file),
// fleet.ErrPasswordFile, fleet.ErrCAFile, fleet.ErrStoreURL,
// fleet.ErrConfig; and ErrFleetAuto for a fleet with max: auto. A store
// out of reach is no error: the agent starts in fallback.
func (a *Agent) StartFleet(p tiers.Policy, member string) (*fleet.Controller, error) {
	if p.Fleet == nil {
		return nil, nil
	}
	if p.Auto != nil {
		return nil, ErrFleetAuto
	}
	if a.closed.Load() {
		return nil, errClosed
	}
	a.applyMu.Lock()
	if a.fleet.c.Load() != nil {
		a.applyMu.Unlock()
		return nil, errors.New("fleet: a controller runs already")
	}
	a.fleet.given, a.fleet.member = p, member
	a.applyMu.Unlock()
	c, err := fleet.Start(FleetConfig(p.Fleet, member), a.lim, (*fleetSide)(a), a.log)
	if err != nil {
		return nil, fmt.Errorf("fleet %s: %w", p.Fleet.Name, err)
	}
	a.fleet.c.Store(c)
	return c, nil
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
	return a.applyLocked(a.fleet.given.FleetFallbackPolicy(members))
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
	return a.applyLocked(a.fleet.given)
}

// fleetPolicy is what a reload applies in place of p (a.applyMu held):
// p's fallback policy while the controller holds the agent in fallback.
func (a *Agent) fleetPolicy(p tiers.Policy) tiers.Policy {
	if a.fleet.in {
		return p.FleetFallbackPolicy(a.fleet.members)
	}
	return p
}

// fleetApplied tells the controller that a reload applied p as given
// (a.applyMu held): it reads password_file again and takes the new
// report, ttl and fallback. A fleet removed, or one that names another
// store or fleet, takes a restart of the agent; the log says so.
func (a *Agent) fleetApplied(p tiers.Policy) {
	c := a.fleet.c.Load()
	if c == nil {
		return
	}
	if p.Fleet == nil {
		a.log.Warn("fleet: the reloaded policy has no fleet block; the controller goes on until the agent restarts")
		return
	}
	a.fleet.given = p
	if err := c.Reload(FleetConfig(p.Fleet, a.fleet.member)); errors.Is(err, fleet.ErrRestart) {
		a.log.Warn("fleet: the reloaded policy names another fleet or store; restart the agent to join it", "fleet", p.Fleet.Name)
	} else if err != nil {
		a.log.Error("fleet: reload", "err", err)
	}
}

// stopFleet stops the controller and leaves the fleet, before Close takes
// applyMu: the controller's loop may wait for it in EnterFallback.
func (a *Agent) stopFleet() {
	c := a.fleet.c.Load()
	if c == nil {
		return
	}
	if err := c.Close(); err != nil {
		a.log.Warn("fleet: leave", "err", err)
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
