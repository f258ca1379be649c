package tiers

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"go.yaml.in/yaml/v3"
)

// rules parses the select sequence (docs/design.md §3): each rule's proto,
// ports, count and dests. This file also holds the port and prefix parsers
// that exempt shares.
func (ps *yamlParser) rules(key string, v *yaml.Node) ([]Rule, error) {
	if isNull(v) || v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
		return nil, valueErr(key, v, ErrEmptySelect, "a policy needs at least one select rule")
	}
	items, err := ps.sequence(key, v, MaxSelectRules, "rules")
	if err != nil {
		return nil, err
	}
	rules := make([]Rule, len(items))
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", key, i)
		r := &rules[i]
		seen, err := ps.mapping(path, item, []field{
			{"proto", func(key string, v *yaml.Node) error {
				var err error
				r.Proto, err = choice(key, v, "udp or tcp", map[string]Proto{"udp": ProtoUDP, "tcp": ProtoTCP}, ErrProto)
				return err
			}},
			{"ports", func(key string, v *yaml.Node) error {
				ports, err := ps.ports(key, v)
				r.Ports = ports
				return err
			}},
			{"dests", func(key string, v *yaml.Node) error {
				if isNull(v) || v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
					return valueErr(key, v, ErrCIDR, "empty dests: leave the key out for the host's own addresses (local)")
				}
				v, r.Local = withoutLocal(v)
				if v == nil {
					return nil
				}
				pfx, err := ps.prefixes(key, v)
				r.Dests = pfx
				return err
			}},
			{"count", func(key string, v *yaml.Node) error {
				var err error
				r.Count, err = choice(key, v, "packets or syn", map[string]Count{"packets": CountPackets, "syn": CountSYN}, ErrCount)
				return err
			}},
		})
		if err != nil {
			return nil, err
		}
		for _, name := range []string{"proto", "ports"} {
			if !seen[name] {
				return nil, &ConfigError{Key: path + "." + name, Line: item.Line,
					Err: fmt.Errorf("%w: a select rule needs proto and ports", ErrMissingKey)}
			}
		}
		if !seen["count"] && r.Proto == ProtoTCP {
			r.Count = CountSYN
		}
		if !seen["dests"] {
			r.Local = true
		}
	}
	return rules, nil
}

func (ps *yamlParser) ports(key string, v *yaml.Node) ([]PortRange, error) {
	if isNull(v) || v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
		return nil, valueErr(key, v, ErrPort, "a rule needs at least one port")
	}
	items, err := ps.sequence(key, v, 0, "ports")
	if err != nil {
		return nil, err
	}
	ports := make([]PortRange, len(items))
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", key, i)
		if item.Kind != yaml.ScalarNode || (item.ShortTag() != "!!int" && item.ShortTag() != "!!str") {
			return nil, typeErr(path, item, `a port such as 514 or a range such as "1000-2000"`)
		}
		pr, ok := parsePortRange(item.Value)
		if !ok {
			return nil, valueErr(path, item, ErrPort, "want a port from 1 to 65535, or a range first-last with first <= last")
		}
		ports[i] = pr
	}
	return ports, nil
}

// parsePortRange parses "514" or "1000-2000" (decimal digits only) into a
// range within 1..65535 with First <= Last.
func parsePortRange(s string) (PortRange, bool) {
	first, last, isRange := strings.Cut(s, "-")
	a, ok := parsePort(strings.TrimSpace(first))
	if !ok {
		return PortRange{}, false
	}
	b := a
	if isRange {
		if b, ok = parsePort(strings.TrimSpace(last)); !ok || b < a {
			return PortRange{}, false
		}
	}
	return PortRange{First: a, Last: b}, true
}

func parsePort(s string) (uint16, bool) {
	if s == "" || len(s) > 5 {
		return 0, false
	}
	n := 0
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
		n = n*10 + int(r-'0')
	}
	if n < 1 || n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

func (ps *yamlParser) prefixes(key string, v *yaml.Node) ([]netip.Prefix, error) {
	items, err := ps.sequence(key, v, 0, "prefixes")
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, nil
	}
	out := make([]netip.Prefix, len(items))
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", key, i)
		s, err := scalar(path, item, "a CIDR such as 192.0.2.0/24")
		if err != nil {
			return nil, err
		}
		pfx, err := parsePrefix(s)
		if err != nil {
			return nil, valueErr(path, item, ErrCIDR, "%v", err)
		}
		out[i] = pfx
	}
	return out, nil
}

// parsePrefix parses a CIDR, or a bare address as a one-host prefix, and
// clears the host bits.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			// netip's message repeats the input: keep only its reason.
			msg := err.Error()
			if i := strings.LastIndex(msg, "): "); i >= 0 {
				msg = msg[i+3:]
			}
			return netip.Prefix{}, errors.New(msg)
		}
		if msg := mappedPrefix(p); msg != "" {
			return netip.Prefix{}, errors.New(msg)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, errors.New("want a CIDR such as 192.0.2.0/24 or 2001:db8::/32")
	}
	if a.Zone() != "" {
		return netip.Prefix{}, errors.New("an address with a zone is not a prefix")
	}
	p := netip.PrefixFrom(a, a.BitLen())
	if msg := mappedPrefix(p); msg != "" {
		return netip.Prefix{}, errors.New(msg)
	}
	return p, nil
}

// withoutLocal takes `local` out of a dests value: a scalar `local`, or a
// sequence that holds it among prefixes. It returns what is left (nil for
// nothing) and whether local was there.
func withoutLocal(v *yaml.Node) (*yaml.Node, bool) {
	if v.Kind == yaml.ScalarNode && v.Value == "local" {
		return nil, true
	}
	if v.Kind != yaml.SequenceNode {
		return v, false
	}
	rest := *v
	rest.Content = nil
	local := false
	for _, c := range v.Content {
		if c.Kind == yaml.ScalarNode && c.Value == "local" {
			local = true
			continue
		}
		rest.Content = append(rest.Content, c)
	}
	if len(rest.Content) == 0 {
		return nil, local
	}
	return &rest, local
}
