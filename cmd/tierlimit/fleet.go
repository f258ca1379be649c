package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// checkFleetFiles reads the fleet's password_file, when p has a fleet,
// before anything is attached: an unreadable or empty one refuses to
// start (exit 2, naming fleet.password_file; docs/design.md §12). The
// secret is dropped at once; the controller reads the file again.
func checkFleetFiles(p tiers.Policy) error {
	if p.Fleet == nil || p.Fleet.PasswordFile == "" {
		return nil
	}
	if _, err := storeurl.ReadPassword(p.Fleet.PasswordFile, os.ReadFile); err != nil {
		return configError{&tiers.ConfigError{Key: "fleet.password_file", Value: p.Fleet.PasswordFile, Err: fmt.Errorf("%w: %v", tiers.ErrFleet, err)}}
	}
	return nil
}

// checkFleetStore checks the connection settings of p's fleet, when p has
// one, before anything is attached, and asks its store once within one
// fleet.report: a ca_file, cert_file, key_file or sentinel_password_file
// that cannot be read is explainFleet's exit 2, naming the key. A store
// that refuses the credentials is not (issue 40: no node is left
// unprotected because of its store): the controller starts in fallback
// with an ERROR and fleet_auth_failed, and keeps retrying. Any other
// answer, or none, leaves it to the controller's start: a store out of
// reach starts run in fallback.
func checkFleetStore(ctx context.Context, p tiers.Policy) error {
	if p.Fleet == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.Fleet.Report)
	defer cancel()
	_, err := fleet.Status(ctx, agent.FleetConfig(p.Fleet, "preflight"))
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fleet.ErrAuth) {
		return nil
	}
	if e := explainFleet(err, p.Fleet); isConfig(e) {
		return e
	}
	return nil
}

// fleetStarter is what startFleet needs of the agent (*agent.Agent).
type fleetStarter interface {
	StartFleet(p tiers.Policy, m agent.FleetMember) (*fleet.Controller, error)
}

// startFleet starts the fleet controller when p has a fleet block
// (docs/design.md §12). A store out of reach is no error: the controller
// warns and the agent starts in fallback; so is a store that refuses the
// credentials (an ERROR, fleet_auth_failed, and fallback until it takes
// them). The errors that refuse to start are words for a person, exit 2:
// an unreadable password_file (naming fleet.password_file) or
// sentinel_password_file, a bad ca_file, cert_file or key_file, store or
// other key, and a fleet with max: auto.
func startFleet(a fleetStarter, p tiers.Policy, m agent.FleetMember) error {
	if p.Fleet == nil {
		return nil
	}
	_, err := a.StartFleet(p, m)
	return explainFleet(err, p.Fleet)
}

// explainFleet words an error of the fleet controller's start (or of
// status --fleet) for a person, naming the policy key to change.
func explainFleet(err error, f *tiers.Fleet) error {
	var ce *tiers.ConfigError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return configError{err}
	case errors.Is(err, fleet.ErrAuth):
		return configError{fmt.Errorf("fleet.password_file %s: the store %s refused the credentials: check the password in fleet.password_file (and the ACL user in fleet.store): %w",
			orNone(f.PasswordFile), storeurl.Redact(f.Store), err)}
	case errors.Is(err, fleet.ErrPasswordFile):
		return configError{fmt.Errorf("fleet.password_file %s: %w", orNone(f.PasswordFile), err)}
	case errors.Is(err, fleet.ErrCAFile):
		return configError{fmt.Errorf("fleet.ca_file %s: %w", orNone(f.CAFile), err)}
	case errors.Is(err, fleet.ErrCertFile):
		return configError{fmt.Errorf("fleet.cert_file %s, fleet.key_file %s: %w", orNone(f.CertFile), orNone(f.KeyFile), err)}
	case errors.Is(err, fleet.ErrSentinelPasswordFile):
		return configError{fmt.Errorf("fleet.sentinel_password_file %s: %w", orNone(f.SentinelPasswordFile), err)}
	case errors.Is(err, fleet.ErrStoreURL):
		return configError{fmt.Errorf("fleet.store: %w", err)}
	case errors.Is(err, fleet.ErrConfig):
		return configError{err}
	}
	return err
}

func orNone(path string) string {
	if path == "" {
		return "(none set)"
	}
	return path
}

// logFleet logs the fleet run joins, once it started.
func logFleet(log *slog.Logger, p tiers.Policy, member string) {
	if p.Fleet == nil {
		return
	}
	if member == "" {
		member, _ = os.Hostname()
	}
	log.Info("fleet", "member", member, "fleet", p.Fleet.String())
}

// statusFleet prints the members of the fleet that the policy in config
// names, as the store holds them (agent/fleet.Status): each one's last
// estimate and how long ago the store heard from it. It needs no agent,
// only the policy and the store.
func statusFleet(ctx context.Context, w io.Writer, config string, asJSON bool) error {
	if config == "" {
		return usageErrorf("status --fleet: --config is required: the policy whose fleet: section names the store")
	}
	p, err := tiers.LoadFile(config)
	if err != nil {
		return configError{err}
	}
	if p.Fleet == nil {
		return configError{fmt.Errorf("%s: no fleet: section; status --fleet lists the members of the policy's fleet", config)}
	}
	f := p.Fleet
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ms, err := fleet.Status(ctx, agent.FleetConfig(f, "status"))
	if err != nil {
		return storeError(err, f)
	}
	if asJSON {
		return writeFleetJSON(w, f, ms)
	}
	return writeFleet(w, f, ms)
}

// storeError words an error of a status read from fleet f's store:
// explainFleet's wording when it has one, else the store's URL, redacted.
func storeError(err error, f *tiers.Fleet) error {
	if e := explainFleet(err, f); e != err {
		return e
	}
	return fmt.Errorf("fleet %s: the store %s: %w", f.Name, storeurl.Redact(f.Store), err)
}

// fleetJSON is status --fleet --json.
type fleetJSON struct {
	Name    string           `json:"name"`
	Store   string           `json:"store"`
	Max     uint64           `json:"max_packets"`
	TTLNs   int64            `json:"ttl_ns"`
	Offered uint64           `json:"offered_packets"`
	Members []fleetMemberOut `json:"members"`
}

// fleetMemberOut is one entry: one instance of a member (docs/design.md
// §12, Identity), with the settings it wrote (Agreement).
type fleetMemberOut struct {
	Name       string    `json:"name"`
	Instance   string    `json:"instance"`
	Estimate   uint64    `json:"estimate_packets"`    // R̂ of all its selected packets
	EstimateIn uint64    `json:"estimate_in_packets"` // R̂ of its in-budget packets
	Heard      time.Time `json:"heard"`
	AgeNs      int64     `json:"age_ns"`
	Stale      bool      `json:"stale"` // older than its own ttl: out of the fleet
	WindowNs   int64     `json:"window_ns"`
	MemberMax  uint64    `json:"fleet_max_packets"`
	MemberTTL  int64     `json:"member_ttl_ns"`
	Digest     string    `json:"table_digest"`
	Conflict   bool      `json:"name_conflict"`   // another live instance under this name
	Differs    bool      `json:"settings_differ"` // not the most members' settings
}

func writeFleetJSON(w io.Writer, f *tiers.Fleet, ms []fleet.Member) error {
	out := fleetJSON{Name: f.Name, Store: storeurl.Redact(f.Store), Max: f.Max, TTLNs: f.TTL.Nanoseconds(), Members: []fleetMemberOut{}}
	for _, m := range ms {
		if m.Live() {
			out.Offered += m.Estimate
		}
		out.Members = append(out.Members, fleetMemberOut{Name: m.Name, Instance: m.Instance, Estimate: m.Estimate, EstimateIn: m.In,
			Heard: m.Heard.UTC(), AgeNs: m.Age.Nanoseconds(), Stale: !m.Live(), WindowNs: m.Window.Nanoseconds(),
			MemberMax: m.Max, MemberTTL: m.TTL.Nanoseconds(), Digest: m.Digest, Conflict: m.Conflict, Differs: m.Differs})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeFleet(w io.Writer, f *tiers.Fleet, ms []fleet.Member) error {
	var sum uint64
	live := 0
	var conflicts, differ []string
	for _, m := range ms {
		if m.Live() {
			sum += m.Estimate
			live++
		}
		if m.Conflict && !slices.Contains(conflicts, m.Name) {
			conflicts = append(conflicts, m.Name)
		}
		if m.Differs {
			differ = append(differ, m.Name+"/"+m.Instance[:min(4, len(m.Instance))])
		}
	}
	fmt.Fprintf(w, "fleet %s at %s: %d members heard from within their ttl, R̂_fleet %d of fleet.max %d per window\n",
		f.Name, storeurl.Redact(f.Store), live, sum, f.Max)
	if len(conflicts) > 0 {
		fmt.Fprintf(w, "CONFLICT: more than one agent reports under the name %s: each is counted as a member; give each host its own name (run --fleet-member)\n",
			strings.Join(conflicts, ", "))
	}
	if len(differ) > 0 {
		fmt.Fprintf(w, "DIFFERS: %s: window, fleet.max, ttl or tier table not the most members'; each member judges on its own (docs/design.md §12, Agreement)\n",
			strings.Join(differ, ", "))
	}
	if len(ms) == 0 {
		_, err := fmt.Fprintln(w, "no members: none has reported within ttl")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tINSTANCE\tESTIMATE\tIN BUDGET\tHEARD\tWINDOW\tFLEET.MAX\tTTL\tTABLE\tFLAGS")
	for _, m := range ms {
		heard := fmt.Sprintf("%s ago", m.Age.Round(time.Millisecond))
		if !m.Live() {
			heard += " (over its ttl: out of the fleet)"
		}
		var flags []string
		if m.Conflict {
			flags = append(flags, "name-conflict")
		}
		if m.Differs {
			flags = append(flags, "settings-differ")
		}
		if len(flags) == 0 {
			flags = append(flags, "-")
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", m.Name, m.Instance, m.Estimate, m.In, heard,
			m.Window, m.Max, m.TTL, m.Digest, strings.Join(flags, ","))
	}
	return tw.Flush()
}
