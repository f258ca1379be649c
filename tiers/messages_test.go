package tiers

import (
	"strings"
	"testing"
)

// TestErrorMessagesAsWritten: errors quote a value as the config wrote it
// (window: 2h, not 2h0m0s), name what is missing (strategys[0], not
// strategys[-1]), and never repeat a store URL, which may hold a password
// (docs/policy.md, fleet errors), redacted or not.
func TestErrorMessagesAsWritten(t *testing.T) {
	withPassword := Default()
	withPassword.Fleet = &Fleet{Name: "eu", Store: "redis://u:secret@h:6379/0", Max: 1000,
		Report: DefaultFleetReport, TTL: DefaultFleetTTL, Fallback: FallbackShare}
	for _, c := range []struct {
		name   string
		parse  func() error
		want   []string // in the message
		absent []string // never in it
	}{
		{"window 2h", yamlErr("window: 2h\nmax: 100\n"),
			[]string{`line 1: window: "2h": bad window: must be more than 0 and at most 1h0m0s`}, []string{"2h0m0s"}},
		{"window 90m", yamlErr("max: 100\nwindow: 90m\n"),
			[]string{`line 2: window: "90m": bad window`}, []string{"1h30m0s"}},
		{"smooth window 10ms", yamlErr("max: 100\nwindow: 10ms\n"),
			[]string{`line 2: window: "10ms": bad window: shape smooth needs`}, nil},
		{"window not a duration", yamlErr("window: 2 hours\n"),
			[]string{`line 1: window: "2 hours": bad window: want a duration`}, nil},
		{"strategys[1] alone", propsErr("limiter.strategys[1].limit=70%\nlimiter.strategys[1].rate=20%\n"),
			[]string{"line 1: limiter.strategys[0]: missing key: strategys[0] is missing, and strategys[1] is set"}, []string{"[-1]"}},
		{"strategys[2] after [0]", propsErr("limiter.strategys[0].limit=70%\nlimiter.strategys[0].rate=20%\nlimiter.strategys[2].limit=80%\nlimiter.strategys[2].rate=50%\n"),
			[]string{"line 3: limiter.strategys[1]: missing key: strategys[1] is missing, and strategys[2] is set"}, nil},
		{"store with a password", yamlErr("max: 1000\nfleet:\n  name: eu\n  store: redis://u:secret@h:6379/0\n  max: 2000\n"),
			[]string{"line 4: fleet.store: bad fleet setting: the URL holds a password"}, []string{"secret", "REDACTED", "redis://", "h:6379"}},
		{"store with a password, validated", func() error { return withPassword.Validate() },
			[]string{"fleet.store: bad fleet setting: the URL holds a password"}, []string{"secret", "REDACTED", "redis://", "h:6379"}},
		{"store of an unknown scheme", yamlErr("max: 1000\nfleet:\n  name: eu\n  store: memcached://u:secret@h:11211\n  max: 2000\n"),
			[]string{`line 4: fleet.store: bad fleet setting: unknown scheme "memcached"`}, []string{"secret", "REDACTED", "h:11211"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.parse()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q, want %q in it", err, w)
				}
			}
			for _, a := range c.absent {
				if strings.Contains(err.Error(), a) {
					t.Errorf("error %q has %q", err, a)
				}
			}
		})
	}
}

func yamlErr(src string) func() error {
	return func() error { _, err := ParseYAML([]byte(src)); return err }
}

func propsErr(src string) func() error {
	return func() error { _, err := ParseProperties([]byte(src)); return err }
}
