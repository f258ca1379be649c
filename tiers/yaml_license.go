package tiers

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// license parses the license block (docs/design.md §13):
//
//	license:
//	  per_day: 500GB
//	  day_starts: "00:00"
//	  zone: America/Chicago
//	  warn_at: 80%
//	  burst: {window: 5m, max: 3x}
//
// per_day is required; day_starts defaults to 00:00, zone to UTC, warn_at
// to DefaultWarnAt, and burst to none. Validate checks the ranges.
func (ps *yamlParser) license(key string, v *yaml.Node) (*License, error) {
	if isNull(v) {
		return nil, nil
	}
	l := License{Zone: time.UTC, ZoneName: "UTC", WarnAt: DefaultWarnAt}
	seen, err := ps.mapping(key, v, []field{
		{"per_day", func(key string, v *yaml.Node) error {
			s, err := scalar(key, v, "a volume such as 500GB or 2TiB")
			if err != nil {
				return err
			}
			n, _, err := ParseSize(s)
			if err != nil && !(errors.Is(err, ErrSize) && n == 0) { // 0 is Validate's: a per_day of 0
				return valueErr(key, v, ErrType, "%v", err)
			}
			l.PerDay = n
			ps.written[key] = nodeValue(v)
			return nil
		}},
		{"day_starts", func(key string, v *yaml.Node) error {
			d, ok := parseClock(v)
			if !ok {
				return valueErr(key, v, ErrLicense, `want a time of day HH:MM (24-hour, quoted), such as "00:00"`)
			}
			l.DayStarts = d
			return nil
		}},
		{"zone", func(key string, v *yaml.Node) error {
			s, err := scalar(key, v, "an IANA time zone such as America/Chicago")
			if err != nil {
				return err
			}
			loc, err := time.LoadLocation(s)
			if err != nil || s == "" || strings.EqualFold(s, "local") {
				return valueErr(key, v, ErrLicense, "unknown zone: want an IANA time zone such as America/Chicago or UTC")
			}
			l.Zone, l.ZoneName = loc, s
			return nil
		}},
		{"warn_at", func(key string, v *yaml.Node) error {
			pct, err := percentNode(key, v)
			if err != nil {
				return err
			}
			l.WarnAt = pct
			ps.written[key] = nodeValue(v)
			return nil
		}},
		{"burst", func(key string, v *yaml.Node) error { return ps.licenseBurst(key, v, &l.Burst) }},
	})
	if err != nil {
		return nil, err
	}
	if !seen["per_day"] {
		return nil, &ConfigError{Key: key + ".per_day", Line: v.Line, Err: fmt.Errorf("%w: a license needs per_day, its daily volume", ErrMissingKey)}
	}
	return &l, nil
}

// licenseBurst parses license.burst: {window: 5m, max: 3x}; both keys
// are required.
func (ps *yamlParser) licenseBurst(key string, v *yaml.Node, b *LicenseBurst) error {
	if isNull(v) {
		return nil
	}
	seen, err := ps.mapping(key, v, []field{
		{"window", func(key string, v *yaml.Node) error {
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
				return typeErr(key, v, "a duration such as 5m")
			}
			d, err := time.ParseDuration(v.Value)
			if err != nil {
				return typeErr(key, v, "a duration such as 5m")
			}
			if d <= 0 {
				return valueErr(key, v, ErrLicense, "want a duration of more than 0 and at most a day (24h)")
			}
			b.Window = d
			ps.written[key] = nodeValue(v)
			return nil
		}},
		{"max", func(key string, v *yaml.Node) error {
			s, err := scalar(key, v, "a multiple of the day's average rate such as 3x")
			if err != nil {
				return err
			}
			m, ok, _ := parseMicro(strings.TrimSuffix(strings.TrimSpace(s), "x"))
			if !ok || !strings.HasSuffix(strings.TrimSpace(s), "x") {
				return typeErr(key, v, "a multiple of the day's average rate such as 3x")
			}
			b.Max = Percent{m * 100}
			ps.written[key] = nodeValue(v)
			return nil
		}},
	})
	if err != nil {
		return err
	}
	for _, k := range []string{"window", "max"} {
		if !seen[k] {
			return &ConfigError{Key: key + "." + k, Line: v.Line, Err: fmt.Errorf("%w: a burst cap needs window and max", ErrMissingKey)}
		}
	}
	return nil
}

// parseClock reads "HH:MM" (24-hour) as a time of day.
func parseClock(v *yaml.Node) (time.Duration, bool) {
	if v.Kind != yaml.ScalarNode || isNull(v) {
		return 0, false
	}
	t, err := time.Parse("15:04", strings.TrimSpace(v.Value))
	if err != nil {
		return 0, false
	}
	return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute, true
}

// formatLicenseBytes prints bytes in the largest decimal unit (B, KB, MB,
// GB, TB) that keeps a whole or one-decimal number: 500GB, 1.5TB, 812B.
func formatLicenseBytes(n uint64) string {
	units := []string{"B", "KB", "MB", "GB", "TB", "PB"}
	f, i := float64(n), 0
	for f >= 1000 && i < len(units)-1 {
		f /= 1000
		i++
	}
	if i == 0 || f == float64(int64(f)) {
		return fmt.Sprintf("%.0f%s", f, units[i])
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}
