package tiers

import (
	"go.yaml.in/yaml/v3"
)

// autoYAML parses `max: auto` together with the `auto:` block, once the
// mapping has been walked: isAuto is whether max was "auto", and block the
// auto node (nil when absent).
func (ps *yamlParser) autoYAML(p *Policy, isAuto bool, block *yaml.Node) error {
	if !isAuto {
		if block != nil {
			return valueErr("auto", block, ErrAuto, "an auto block needs max: auto")
		}
		return nil
	}
	var a AutoMax
	if block != nil && !isNull(block) {
		_, err := ps.mapping("auto", block, []field{
			{"start", ps.autoField(&a.Start)},
			{"floor", ps.autoField(&a.Floor)},
			{"ceiling", ps.autoField(&a.Ceiling)},
			{"netns", ps.netnsField(&a.NetNS)},
		})
		if err != nil {
			return err
		}
	}
	a.defaults(p.Count)
	p.Auto = &a
	p.Max = a.Start
	return nil
}

// autoField reads a bound; 0 and what no uint64 holds are kept as
// MaxPackets+1, so that defaults leaves them and Validate refuses them.
func (ps *yamlParser) autoField(dst *uint64) func(key string, v *yaml.Node) error {
	return func(key string, v *yaml.Node) (err error) {
		if *dst, err = ps.packets(key, v, "a whole number of packets (or a size such as 500MB under count: bytes)"); err != nil {
			return err
		}
		if *dst == 0 {
			*dst = MaxPackets + 1
		}
		return nil
	}
}

// netnsField reads auto.netns: a non-empty path (Validate checks that it
// is absolute).
func (ps *yamlParser) netnsField(dst *string) func(key string, v *yaml.Node) error {
	return func(key string, v *yaml.Node) error {
		if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
			return typeErr(key, v, "a path to a network namespace")
		}
		if v.Value == "" {
			return valueErr(key, v, ErrAuto, "want a path to a network namespace, such as /proc/PID/ns/net or /run/netns/NAME; leave the key out for the agent's own")
		}
		*dst = v.Value
		return nil
	}
}
