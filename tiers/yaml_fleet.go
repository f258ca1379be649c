package tiers

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// fleet parses the fleet mapping; a null fleet is off:
//
//	fleet: {name: syslog-eu, store: redis://10.0.0.5:6379/0, max: 200000}
func (ps *yamlParser) fleet(key string, v *yaml.Node) (*Fleet, error) {
	if isNull(v) {
		return nil, nil
	}
	f := &Fleet{Report: DefaultFleetReport, TTL: DefaultFleetTTL}
	text := func(dst *string, want string) func(string, *yaml.Node) error {
		return func(key string, v *yaml.Node) error {
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" || v.Value == "" {
				return typeErr(key, v, want)
			}
			*dst = v.Value
			return nil
		}
	}
	duration := func(dst *time.Duration) func(string, *yaml.Node) error {
		return func(key string, v *yaml.Node) error {
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
				return typeErr(key, v, "a duration such as 100ms or 3s")
			}
			d, err := time.ParseDuration(v.Value)
			if err != nil {
				return typeErr(key, v, "a duration such as 100ms or 3s")
			}
			if d <= 0 || d > MaxFleetTTL {
				return valueErr(key, v, ErrFleet, "must be more than 0 and at most %s", MaxFleetTTL)
			}
			*dst = d
			return nil
		}
	}
	seen, err := ps.mapping(key, v, []field{
		{"name", func(key string, v *yaml.Node) error {
			if err := text(&f.Name, "a fleet name")(key, v); err != nil {
				return err
			}
			if !fleetNameRE.MatchString(f.Name) {
				return valueErr(key, v, ErrFleet, "want 1 to 64 of A-Z a-z 0-9 . _ -")
			}
			return nil
		}},
		{"store", func(key string, v *yaml.Node) error {
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
				return typeErr(key, v, "a store URL")
			}
			if _, err := storeurl.Parse(v.Value); err != nil {
				ce := valueErr(key, v, ErrFleet, "%v", err)
				ce.Value = "" // never repeated: it may hold a password
				return ce
			}
			f.Store = v.Value
			return nil
		}},
		{"password_file", text(&f.PasswordFile, "an absolute path")},
		{"ca_file", text(&f.CAFile, "an absolute path")},
		{"cert_file", text(&f.CertFile, "an absolute path")},
		{"key_file", text(&f.KeyFile, "an absolute path")},
		{"server_name", text(&f.ServerName, "a DNS name")},
		{"sentinel_password_file", text(&f.SentinelPasswordFile, "an absolute path")},
		{"sentinel_user", text(&f.SentinelUser, "an ACL user name")},
		{"max", func(key string, v *yaml.Node) (err error) {
			f.Max, err = ps.packets(key, v, "a whole number of packets per window (or a size such as 500MB under count: bytes)")
			return err
		}},
		{"report", duration(&f.Report)},
		{"ttl", duration(&f.TTL)},
		{"fallback", func(key string, v *yaml.Node) (err error) {
			f.Fallback, err = choice(key, v, "share, local or last",
				map[string]FleetFallback{"share": FallbackShare, "local": FallbackLocal, "last": FallbackLast}, ErrFleet)
			return err
		}},
	})
	if err != nil {
		return nil, err
	}
	for _, name := range []string{"name", "store", "max"} {
		if !seen[name] {
			return nil, &ConfigError{Key: key + "." + name, Line: v.Line,
				Err: fmt.Errorf("%w: a fleet needs name, store and max", ErrMissingKey)}
		}
	}
	return f, nil
}
