package tiers

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// severityList parses a YAML list of severities.
func (ps *yamlParser) severityList(key string, v *yaml.Node) ([]int, error) {
	if isNull(v) {
		return nil, nil
	}
	items, err := ps.sequence(key, v, 8, "severities")
	if err != nil {
		return nil, err
	}
	out := make([]int, len(items))
	for i, item := range items {
		k := fmt.Sprintf("%s[%d]", key, i)
		s, err := scalar(k, item, "a severity name or 0-7")
		if err != nil {
			return nil, err
		}
		if out[i], err = ParseSeverity(s); err != nil {
			return nil, &ConfigError{Key: k, Value: s, Line: item.Line, Err: err}
		}
	}
	return out, nil
}

// facilityList parses a YAML list of facilities (severity.protect_facilities).
func (ps *yamlParser) facilityList(key string, v *yaml.Node) ([]int, error) {
	if isNull(v) {
		return nil, nil
	}
	items, err := ps.sequence(key, v, NumFacilities, "facilities")
	if err != nil {
		return nil, err
	}
	out := make([]int, len(items))
	for i, item := range items {
		k := fmt.Sprintf("%s[%d]", key, i)
		s, err := scalar(k, item, "a facility name or 0-23")
		if err != nil {
			return nil, err
		}
		if out[i], err = ParseFacility(s); err != nil {
			return nil, &ConfigError{Key: k, Value: s, Line: item.Line, Err: err}
		}
	}
	return out, nil
}

// severity parses the `severity:` block; null turns it off.
func (ps *yamlParser) severity(key string, v *yaml.Node) (*Severity, error) {
	if isNull(v) {
		return nil, nil
	}
	s := &Severity{ProtectBudget: Pct(5)}
	_, err := ps.mapping(key, v, []field{
		{"protect", func(key string, v *yaml.Node) (err error) {
			s.Protect, err = ps.severityList(key, v)
			return err
		}},
		{"protect_budget", func(key string, v *yaml.Node) (err error) {
			s.ProtectBudget, err = percentNode(key, v)
			return err
		}},
		{"shed_first", func(key string, v *yaml.Node) (err error) {
			s.ShedFirst, err = ps.severityList(key, v)
			return err
		}},
		{"protect_facilities", func(key string, v *yaml.Node) (err error) {
			s.ProtectFacilities, err = ps.facilityList(key, v)
			return err
		}},
	})
	return s, err
}
