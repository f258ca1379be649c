package tiers

import (
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// sources parses the sources mapping (docs/design.md §6):
//
//	sources: {budget: 10%, prefix_v4: 32, prefix_v6: 64}
//
// budget is a percent of max ("10%") or a whole number of packets (100);
// it is required. The prefix lengths default to DefaultPrefixV4 and
// DefaultPrefixV6. A null sources is off.
func (ps *yamlParser) sources(key string, v *yaml.Node) (Sources, error) {
	s := Sources{PrefixV4: DefaultPrefixV4, PrefixV6: DefaultPrefixV6}
	if isNull(v) {
		return Sources{}, nil
	}
	prefix := func(dst *int, limit int) func(string, *yaml.Node) error {
		return func(key string, v *yaml.Node) error {
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" {
				return typeErr(key, v, fmt.Sprintf("a prefix length from 1 to %d", limit))
			}
			var n int
			if err := v.Decode(&n); err != nil || n < 1 || n > limit {
				return valueErr(key, v, ErrPrefixLen, "want 1 to %d", limit)
			}
			*dst = n
			return nil
		}
	}
	seen, err := ps.mapping(key, v, []field{
		{"budget", func(key string, v *yaml.Node) error {
			return ps.budgetNode(key, v, &s)
		}},
		{"prefix_v4", prefix(&s.PrefixV4, 32)},
		{"prefix_v6", prefix(&s.PrefixV6, 128)},
	})
	if err != nil {
		return Sources{}, err
	}
	if !seen["budget"] {
		return Sources{}, &ConfigError{Key: key + ".budget", Line: v.Line,
			Err: fmt.Errorf("%w: sources needs a budget, such as 10%% or 500 (leave sources out to turn it off)", ErrMissingKey)}
	}
	return s, nil
}

// budgetNode parses a budget: text ending in % is a percent of max, a whole
// number is packets (bytes under count: bytes), a size with a byte unit
// (64KB) is bytes; anything else is ErrType, and a zero budget ErrBudget.
func (ps *yamlParser) budgetNode(key string, v *yaml.Node, s *Sources) error {
	const want = "a percent of max such as 10%, a whole number of packets, or a size such as 64KB under count: bytes"
	if v.Kind != yaml.ScalarNode || isNull(v) {
		return typeErr(key, v, want)
	}
	switch {
	case v.ShortTag() == "!!int":
		var n int64
		if err := v.Decode(&n); err != nil || n < 1 {
			return valueErr(key, v, ErrBudget, "want at least 1")
		}
		s.BudgetPackets = uint64(n)
	case v.ShortTag() == "!!str" && strings.HasSuffix(strings.TrimSpace(v.Value), "%"):
		pc, err := ParsePercent(v.Value)
		if err != nil {
			return &ConfigError{Key: key, Value: v.Value, Line: v.Line, Err: err}
		}
		if pc.micro <= 0 {
			return valueErr(key, v, ErrBudget, "must be more than 0%%")
		}
		s.Budget = pc
	case v.ShortTag() == "!!str":
		n, unit, err := ParseSize(v.Value)
		switch {
		case errors.Is(err, ErrSize):
			return valueErr(key, v, ErrBudget, "want at least 1 and at most %d", uint64(MaxBudgetPackets))
		case err != nil || !unit:
			return typeErr(key, v, want)
		}
		ps.units = append(ps.units, unitAt{key, v})
		s.BudgetPackets = n
		ps.written[key] = v.Value
	default:
		return typeErr(key, v, want)
	}
	return nil
}
