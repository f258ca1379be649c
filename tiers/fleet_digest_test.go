package tiers

import "testing"

// TestFleetDigest: the digest follows what the members must agree on (the
// tiers as compiled for fleet.max, the shape) and nothing that is the
// member's own (its local max, its selectors); no fleet, no digest.
func TestFleetDigest(t *testing.T) {
	p := fleetPolicy(t, 1000, 100)
	d := p.FleetDigest()
	if len(d) != 16 {
		t.Fatalf("digest %q; want 16 hex digits", d)
	}
	same := fleetPolicy(t, 1000, 500)
	same.Select = nil
	if got := same.FleetDigest(); got != d {
		t.Errorf("another local max or selectors: digest %s, want %s", got, d)
	}
	for name, q := range map[string]Policy{
		"fleet.max": fleetPolicy(t, 2000, 100),
		"a drop":    func() Policy { q := fleetPolicy(t, 1000, 100); q.Tiers[0].Drop.micro++; return q }(),
		"a tier at": func() Policy { q := fleetPolicy(t, 1000, 100); q.Tiers[0].At.micro -= 10000; return q }(),
		"the shape": func() Policy { q := fleetPolicy(t, 1000, 100); q.Shape = ShapeOrdinal; return q }(),
	} {
		if got := q.FleetDigest(); got == d {
			t.Errorf("%s changed: the digest %s did not", name, got)
		}
	}
	p.Fleet = nil
	if got := p.FleetDigest(); got != "" {
		t.Errorf("no fleet: digest %q; want none", got)
	}
}
