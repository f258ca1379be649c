package tiers

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// fleetYAML is a valid policy with a fleet block; tests append keys.
const fleetYAML = "max: 1000\nfleet:\n  name: syslog-eu\n  store: redis://10.0.0.5:6379/0\n  max: 200000\n"

func TestParseFleet(t *testing.T) {
	base := Fleet{Name: "syslog-eu", Store: "redis://10.0.0.5:6379/0", Max: 200000,
		Report: DefaultFleetReport, TTL: DefaultFleetTTL, Fallback: FallbackShare}
	with := func(f func(*Fleet)) *Fleet { c := base; f(&c); return &c }
	for _, c := range []struct {
		src  string
		want *Fleet
	}{
		{"max: 1000", nil},
		{"max: 1000\nfleet:", nil},
		{fleetYAML, &base},
		{fleetYAML + "  report: 250ms\n  ttl: 10s\n  fallback: local\n",
			with(func(f *Fleet) { f.Report, f.TTL, f.Fallback = 250*time.Millisecond, 10*time.Second, FallbackLocal })},
		{fleetYAML + "  password_file: /etc/tierlimit/fleet.secret\n",
			with(func(f *Fleet) { f.PasswordFile = "/etc/tierlimit/fleet.secret" })},
		{strings.Replace(fleetYAML, "redis://10.0.0.5:6379/0", "rediss://store.example", 1) + "  ca_file: /etc/tierlimit/ca.pem\n",
			with(func(f *Fleet) { f.Store, f.CAFile = "rediss://store.example", "/etc/tierlimit/ca.pem" })},
		{strings.Replace(fleetYAML, "redis://10.0.0.5:6379/0", "redis+sentinel://s1,s2:26380/mymaster", 1),
			with(func(f *Fleet) { f.Store = "redis+sentinel://s1,s2:26380/mymaster" })},
		{strings.Replace(fleetYAML, "redis://10.0.0.5:6379/0", "redis+cluster://h1,h2,h3", 1),
			with(func(f *Fleet) { f.Store = "redis+cluster://h1,h2,h3" })},
		{strings.Replace(fleetYAML, "redis://10.0.0.5:6379/0", "rediss+cluster://h1,h2,h3", 1) + "  ca_file: /etc/ca.pem\n",
			with(func(f *Fleet) { f.Store, f.CAFile = "rediss+cluster://h1,h2,h3", "/etc/ca.pem" })},
		{"max: auto\n" + strings.TrimPrefix(fleetYAML, "max: 1000\n"), &base},
		{strings.Replace(fleetYAML, "redis://10.0.0.5:6379/0", "rediss+sentinel://s1,s2/m", 1) +
			"  cert_file: /etc/tl/c.pem\n  key_file: /etc/tl/k.pem\n  server_name: redis.example.com\n" +
			"  sentinel_password_file: /etc/tl/s.pw\n  sentinel_user: sent\n",
			with(func(f *Fleet) {
				f.Store, f.CertFile, f.KeyFile, f.ServerName = "rediss+sentinel://s1,s2/m", "/etc/tl/c.pem", "/etc/tl/k.pem", "redis.example.com"
				f.SentinelPasswordFile, f.SentinelUser = "/etc/tl/s.pw", "sent"
			})},
		{fleetYAML + "sources: {budget: 10%}\n", &base},
	} {
		p, err := ParseYAML([]byte(c.src))
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		if !reflect.DeepEqual(p.Fleet, c.want) {
			t.Errorf("%q: fleet %+v, want %+v", c.src, p.Fleet, c.want)
		}
		if c.want != nil && !strings.Contains(p.String(), "fleet=[name=syslog-eu") {
			t.Errorf("%q: String %q names no fleet", c.src, p.String())
		}
	}
}

func TestParseFleetInvalid(t *testing.T) {
	store := func(s string) string { return strings.Replace(fleetYAML, "redis://10.0.0.5:6379/0", s, 1) }
	for _, c := range []struct {
		name string
		src  string
		want error
		key  string
		line int
	}{
		{"no name", "max: 1000\nfleet:\n  store: redis://h\n  max: 10", ErrMissingKey, "fleet.name", 3},
		{"no store", "max: 1000\nfleet:\n  name: a\n  max: 10", ErrMissingKey, "fleet.store", 3},
		{"no max", "max: 1000\nfleet:\n  name: a\n  store: redis://h", ErrMissingKey, "fleet.max", 3},
		{"bad name", strings.Replace(fleetYAML, "syslog-eu", "'{eu}'", 1), ErrFleet, "fleet.name", 3},
		{"long name", strings.Replace(fleetYAML, "syslog-eu", strings.Repeat("a", 65), 1), ErrFleet, "fleet.name", 3},
		{"name type", strings.Replace(fleetYAML, "syslog-eu", "[a]", 1), ErrType, "fleet.name", 3},
		{"unknown scheme", store("memcached://h:11211"), ErrFleet, "fleet.store", 4},
		{"http", store("http://h"), ErrFleet, "fleet.store", 4},
		{"no scheme", store("10.0.0.5:6379"), ErrFleet, "fleet.store", 4},
		{"password", store("redis://u:secret@h"), ErrFleet, "fleet.store", 4},
		{"query", store("redis://h?db=1"), ErrFleet, "fleet.store", 4},
		{"two hosts", store("redis://h1,h2"), ErrFleet, "fleet.store", 4},
		{"sentinel no master", store("redis+sentinel://s1,s2"), ErrFleet, "fleet.store", 4},
		{"cluster db", store("redis+cluster://h1,h2/1"), ErrFleet, "fleet.store", 4},
		{"tls cluster db", store("rediss+cluster://h1,h2/1"), ErrFleet, "fleet.store", 4},
		{"ca with sentinel", store("redis+sentinel://s/m") + "  ca_file: /ca.pem\n", ErrFleet, "fleet.ca_file", 6},
		{"bad port", store("redis://h:0"), ErrFleet, "fleet.store", 4},
		{"bad db", store("redis://h/x"), ErrFleet, "fleet.store", 4},
		{"empty host", store("redis+cluster://h1,,h3"), ErrFleet, "fleet.store", 4},
		{"bare ipv6", store("redis://::1"), ErrFleet, "fleet.store", 4},
		{"max 0", strings.Replace(fleetYAML, "200000", "0", 1), ErrMax, "fleet.max", 5},
		{"max over", strings.Replace(fleetYAML, "200000", "1099511627777", 1), ErrMax, "fleet.max", 5},
		{"max negative", strings.Replace(fleetYAML, "200000", "-5", 1), ErrMax, "fleet.max", 5},
		{"max text", strings.Replace(fleetYAML, "200000", "lots", 1), ErrType, "fleet.max", 5},
		{"report >= ttl", fleetYAML + "  report: 3s\n", ErrFleet, "fleet.report", 6},
		{"report > ttl", fleetYAML + "  report: 5s\n  ttl: 1s\n", ErrFleet, "fleet.report", 6},
		{"report 0", fleetYAML + "  report: 0s\n", ErrFleet, "fleet.report", 6},
		{"report negative", fleetYAML + "  report: -1s\n", ErrFleet, "fleet.report", 6},
		{"ttl 0", fleetYAML + "  ttl: 0s\n", ErrFleet, "fleet.ttl", 6},
		{"ttl number", fleetYAML + "  ttl: 3\n", ErrType, "fleet.ttl", 6},
		{"fallback", fleetYAML + "  fallback: none\n", ErrFleet, "fleet.fallback", 6},
		{"unknown key", fleetYAML + "  password: x\n", ErrUnknownKey, "fleet.password", 6},
		{"duplicate key", fleetYAML + "  max: 5\n", ErrDuplicateKey, "fleet.max", 6},
		{"ca without tls", fleetYAML + "  ca_file: /etc/ca.pem\n", ErrFleet, "fleet.ca_file", 6},
		{"relative ca", store("rediss://h") + "  ca_file: ca.pem\n", ErrFleet, "fleet.ca_file", 6},
		{"relative password", fleetYAML + "  password_file: fleet.pw\n", ErrFleet, "fleet.password_file", 6},
		{"cert without tls", fleetYAML + "  cert_file: /c.pem\n  key_file: /k.pem\n", ErrFleet, "fleet.cert_file", 6},
		{"cert without key", store("rediss://h") + "  cert_file: /c.pem\n", ErrFleet, "fleet.cert_file", 6},
		{"key without cert", store("rediss://h") + "  key_file: /k.pem\n", ErrFleet, "fleet.key_file", 6},
		{"relative cert", store("rediss://h") + "  cert_file: c.pem\n  key_file: /k.pem\n", ErrFleet, "fleet.cert_file", 6},
		{"relative key", store("rediss://h") + "  cert_file: /c.pem\n  key_file: k.pem\n", ErrFleet, "fleet.key_file", 7},
		{"server_name without tls", fleetYAML + "  server_name: redis.example.com\n", ErrFleet, "fleet.server_name", 6},
		{"server_name not a name", store("rediss://h") + "  server_name: 'a b'\n", ErrFleet, "fleet.server_name", 6},
		{"server_name number", store("rediss://h") + "  server_name: 5\n", ErrType, "fleet.server_name", 6},
		{"sentinel password without sentinel", fleetYAML + "  sentinel_password_file: /s.pw\n", ErrFleet, "fleet.sentinel_password_file", 6},
		{"relative sentinel password", store("redis+sentinel://s/m") + "  sentinel_password_file: s.pw\n", ErrFleet, "fleet.sentinel_password_file", 6},
		{"sentinel user without sentinel", fleetYAML + "  sentinel_user: sent\n", ErrFleet, "fleet.sentinel_user", 6},
		{"sentinel user with a space", store("redis+sentinel://s/m") + "  sentinel_user: 'a b'\n", ErrFleet, "fleet.sentinel_user", 6},
		{"ordinal", "shape: ordinal\n" + fleetYAML, ErrFleet, "shape", 1},
		{"ordinal after", fleetYAML + "shape: ordinal\n", ErrFleet, "shape", 6},
		// A budget's percent is of the member's own max (docs/design.md §12),
		// not fleet.max: 5 % of max 10 is less than one packet, and 500
		// packets are more than max 10, however large fleet.max.
		{"sources percent of max", strings.Replace(fleetYAML, "max: 1000\n", "max: 10\n", 1) + "sources: {budget: 5%}\n", ErrBudget, "sources.budget", 6},
		{"sources packets over max", strings.Replace(fleetYAML, "max: 1000\n", "max: 10\n", 1) + "sources: {budget: 500}\n", ErrBudget, "sources.budget", 6},
		{"not a mapping", "max: 1000\nfleet: [a]", ErrType, "fleet", 2},
	} {
		_, err := ParseYAML([]byte(c.src))
		t.Run(c.name, func(t *testing.T) {
			checkConfigError(t, err, c.want, c.key, c.line)
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("%v: the error repeats the secret", err)
			}
		})
	}
}

// A Fleet built in Go is checked by Validate, with the same keys.
func TestValidateFleet(t *testing.T) {
	good := Fleet{Name: "a", Store: "redis://h", Max: 100, Report: time.Second, TTL: 2 * time.Second}
	for _, c := range []struct {
		name string
		edit func(p *Policy)
		want error
		key  string
	}{
		{"no name", func(p *Policy) { p.Fleet.Name = "" }, ErrMissingKey, "fleet.name"},
		{"no store", func(p *Policy) { p.Fleet.Store = "" }, ErrMissingKey, "fleet.store"},
		{"scheme", func(p *Policy) { p.Fleet.Store = "tcp://h" }, ErrFleet, "fleet.store"},
		{"max", func(p *Policy) { p.Fleet.Max = MaxPackets + 1 }, ErrMax, "fleet.max"},
		{"report", func(p *Policy) { p.Fleet.Report = 0 }, ErrFleet, "fleet.report"},
		{"ttl", func(p *Policy) { p.Fleet.TTL = -1 }, ErrFleet, "fleet.ttl"},
		{"report = ttl", func(p *Policy) { p.Fleet.Report = p.Fleet.TTL }, ErrFleet, "fleet.report"},
		{"fallback", func(p *Policy) { p.Fleet.Fallback = 7 }, ErrFleet, "fleet.fallback"},
		{"ordinal", func(p *Policy) { p.Shape = ShapeOrdinal }, ErrFleet, "shape"},
		{"cert without tls", func(p *Policy) { p.Fleet.CertFile, p.Fleet.KeyFile = "/c", "/k" }, ErrFleet, "fleet.cert_file"},
		{"key without cert", func(p *Policy) { p.Fleet.Store, p.Fleet.KeyFile = "rediss://h", "/k" }, ErrFleet, "fleet.key_file"},
		{"relative key", func(p *Policy) { p.Fleet.Store, p.Fleet.CertFile, p.Fleet.KeyFile = "rediss://h", "/c", "k" }, ErrFleet, "fleet.key_file"},
		{"server_name", func(p *Policy) { p.Fleet.Store, p.Fleet.ServerName = "rediss://h", "-bad-" }, ErrFleet, "fleet.server_name"},
		{"sentinel user", func(p *Policy) { p.Fleet.SentinelUser = "u" }, ErrFleet, "fleet.sentinel_user"},
		{"sentinel password", func(p *Policy) { p.Fleet.Store, p.Fleet.SentinelPasswordFile = "redis+sentinel://s/m", "s.pw" }, ErrFleet, "fleet.sentinel_password_file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Default()
			f := good
			p.Fleet = &f
			if err := p.Validate(); err != nil {
				t.Fatalf("good fleet: %v", err)
			}
			c.edit(&p)
			checkConfigError(t, p.Validate(), c.want, c.key, 0)
		})
	}
}

// With fleet on, the table is compiled for fleet.max: the same as the
// policy's tiers at max = fleet.max; the fallback policies are the share
// and the local max.
func TestCompileFleet(t *testing.T) {
	p, err := ParseYAML([]byte(fleetYAML))
	if err != nil {
		t.Fatal(err)
	}
	tab := mustCompile(t, p)
	q := p.Clone()
	q.Fleet, q.Max = nil, 200000
	want := mustCompile(t, q)
	if !reflect.DeepEqual(tab.Bounds, want.Bounds) || !reflect.DeepEqual(tab.Smoothed, want.Smoothed) {
		t.Errorf("bounds %v, want %v (fleet.max)", tab.Bounds, want.Bounds)
	}
	if p.Max != 1000 || p.TableMax() != 200000 {
		t.Errorf("Max %d TableMax %d", p.Max, p.TableMax())
	}
	for _, c := range []struct {
		fallback FleetFallback
		members  int
		want     uint64
	}{
		{FallbackShare, 3, 66666}, {FallbackShare, 1, 200000}, {FallbackShare, 0, 1000}, {FallbackShare, 1 << 30, 1},
		{FallbackLocal, 3, 1000},
	} {
		p.Fleet.Fallback = c.fallback
		fb := p.FleetFallbackPolicy(c.members)
		if fb.Fleet != nil || fb.Max != c.want || fb.Validate() != nil {
			t.Errorf("%s of %d: fleet %v max %d, want off and %d", c.fallback, c.members, fb.Fleet, fb.Max, c.want)
		}
		if fb.TableMax() != c.want {
			t.Errorf("%s: TableMax %d", c.fallback, fb.TableMax())
		}
	}
	if p.Fleet == nil || p.Max != 1000 {
		t.Error("FleetFallbackPolicy changed p")
	}
	// With max: auto the share stays within the auto bounds.
	p.Fleet.Fallback = FallbackShare
	p.Auto = &AutoMax{Start: 1000, Floor: 100, Ceiling: 5000}
	for members, want := range map[int]uint64{3: 5000, 1000: 200, 10000: 100} {
		if fb := p.FleetFallbackPolicy(members); fb.Max != want || fb.Auto == nil || fb.Validate() != nil {
			t.Errorf("auto, share of %d: max %d, want %d (%v)", members, fb.Max, want, fb.Validate())
		}
	}
}
