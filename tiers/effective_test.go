package tiers

import (
	"net/netip"
	"testing"
	"time"
)

// TestEffective: the policy compiled for a given policy in each state the
// agent's rooms know: the learnt max (max: auto only), the fleet's
// fallback (share, local, no answer yet; with max: auto the smaller of
// the fallback's and the learnt max), and the host's destinations (the
// unicast ones kept first beyond the budget). given is never changed.
func TestEffective(t *testing.T) {
	fixed := Default()
	fixed.Max = 1000
	auto := fixed.Clone()
	auto.Auto = &AutoMax{Start: 1000, Floor: 100, Ceiling: 5000}
	fleet := &Fleet{Name: "f", Store: "redis://h", Max: 3000, Report: 100 * time.Millisecond, TTL: time.Second, Fallback: FallbackShare}
	withFleet := func(p Policy, fb FleetFallback) Policy {
		q := p.Clone()
		q.Fleet = &Fleet{}
		*q.Fleet = *fleet
		q.Fleet.Fallback = fb
		return q
	}
	a := netip.MustParsePrefix("192.0.2.1/32")
	bcast := netip.MustParsePrefix("192.0.2.255/32")
	host := []LocalDest{{Prefix: a, Unicast: true}, {Prefix: bcast}}
	// over is more of the host's destinations than the trie holds: the
	// broadcast ones first, so that keeping unicast first shows.
	budget := LocalBudget(fixed)
	var over []LocalDest
	for i := range budget + 10 {
		ip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		over = append(over, LocalDest{Prefix: netip.PrefixFrom(ip, 32), Unicast: i >= 20})
	}

	for _, c := range []struct {
		name      string
		given     Policy
		st        State
		wantMax   uint64
		wantFleet bool
		wantLocal int // the destinations of the UDP rule
		uncounted int
	}{
		{"nothing learnt nor followed: given", fixed, State{}, 1000, false, 0, 0},
		{"a learnt max under a fixed max: ignored", fixed, State{LearntMax: 700}, 1000, false, 0, 0},
		{"max: auto, nothing learnt: its start", auto, State{}, 1000, false, 0, 0},
		{"max: auto: the learnt max", auto, State{LearntMax: 700}, 700, false, 0, 0},
		{"fleet: given, fleet on", withFleet(fixed, FallbackShare), State{}, 1000, true, 0, 0},
		{"fallback share: fleet.max ÷ members, fleet off", withFleet(fixed, FallbackShare), State{Fallback: true, Members: 4}, 750, false, 0, 0},
		{"fallback share, no answer yet: the own max", withFleet(fixed, FallbackShare), State{Fallback: true}, 1000, false, 0, 0},
		{"fallback local: the own max", withFleet(fixed, FallbackLocal), State{Fallback: true, Members: 4}, 1000, false, 0, 0},
		{"fallback share with auto: the learnt max below the share", withFleet(auto, FallbackShare), State{LearntMax: 600, Fallback: true, Members: 2}, 600, false, 0, 0},
		{"fallback share with auto: the share below the learnt max", withFleet(auto, FallbackShare), State{LearntMax: 2000, Fallback: true, Members: 2}, 1500, false, 0, 0},
		{"fallback share with auto: the share clamped to the floor", withFleet(auto, FallbackShare), State{LearntMax: 2000, Fallback: true, Members: 100}, 100, false, 0, 0},
		{"fallback without a fleet: given", fixed, State{Fallback: true, Members: 4}, 1000, false, 0, 0},
		{"the host's destinations: all", fixed, State{Local: host}, 1000, false, 2, 0},
		{"beyond the budget: unicast first, the rest uncounted", fixed, State{Local: over}, 1000, false, budget, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			max0, fleet0 := c.given.Max, c.given.Fleet != nil
			p, fit := Effective(c.given, c.st)
			if p.Max != c.wantMax || (p.Fleet != nil) != c.wantFleet {
				t.Errorf("max %d fleet %v; want %d, %v", p.Max, p.Fleet != nil, c.wantMax, c.wantFleet)
			}
			if c.given.Max != max0 || (c.given.Fleet != nil) != fleet0 || len(c.given.Select[0].LocalDests) != 0 {
				t.Error("given changed")
			}
			var udp Rule
			for _, r := range p.Select {
				if r.Proto == ProtoUDP && r.Local {
					udp = r
				}
			}
			if len(udp.LocalDests) != c.wantLocal || fit.Uncounted != c.uncounted || len(fit.Kept) != c.wantLocal {
				t.Errorf("udp rule's local dests %d, kept %d, uncounted %d; want %d, %d", len(udp.LocalDests), len(fit.Kept), fit.Uncounted, c.wantLocal, c.uncounted)
			}
			if c.uncounted > 0 {
				unicast := 0
				for _, d := range fit.Kept {
					if d.Unicast {
						unicast++
					}
				}
				if unicast != budget-10 {
					t.Errorf("kept %d unicast destinations; want all %d", unicast, budget-10)
				}
				if fit.Budget != budget || fit.Entries != len(over) {
					t.Errorf("fit entries %d budget %d; want %d, %d", fit.Entries, fit.Budget, len(over), budget)
				}
			}
			if _, err := Compile(p, 0); err != nil {
				t.Errorf("compile: %v", err)
			}
		})
	}
}

// TestStateLearnt: the fleet's and the adaptive max's view of a given
// policy: the learnt max under max: auto, never the fallback.
func TestStateLearnt(t *testing.T) {
	p := Default()
	p.Max = 1000
	if q := (State{LearntMax: 700, Fallback: true, Members: 9}).Learnt(p); q.Max != 1000 {
		t.Errorf("fixed max: %d, want 1000", q.Max)
	}
	p.Auto = &AutoMax{Start: 1000, Floor: 100, Ceiling: 5000}
	if q := (State{LearntMax: 700, Fallback: true, Members: 9}).Learnt(p); q.Max != 700 || p.Max != 1000 {
		t.Errorf("auto: %d (given %d), want 700 (1000)", q.Max, p.Max)
	}
}
