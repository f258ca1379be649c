package tiers

import (
	_ "embed"
	"fmt"
	"slices"
)

// defaultYAML is the default policy, kept as a commented YAML file so that
// it documents the format too.
//
//go:embed default.yaml
var defaultYAML []byte

var defaultPolicy = mustDefault()

func mustDefault() Policy {
	p, err := parseYAML(defaultYAML, Policy{})
	if err != nil {
		panic(fmt.Sprintf("tiers: embedded default.yaml: %v", err))
	}
	return p
}

// Default returns the embedded default policy (tiers/default.yaml), the
// seed's: mode enforce, window 1s, max 40000 packets, tiers 70%→20%,
// 80%→50%, 100%→100%, selecting udp 514 (count packets) and tcp 601 and 6514
// (count syn), with no exempt sources. Each call returns a fresh copy.
func Default() Policy {
	return defaultPolicy.Clone()
}

// DefaultYAML returns the text of the embedded default policy file.
func DefaultYAML() []byte {
	return slices.Clone(defaultYAML)
}

// Clone returns a deep copy of p that shares no slices with it.
func (p Policy) Clone() Policy {
	p.Tiers = slices.Clone(p.Tiers)
	p.Exempt = slices.Clone(p.Exempt)
	p.Select = slices.Clone(p.Select)
	p.Severity = p.Severity.Clone()
	for i := range p.Select {
		p.Select[i].Ports = slices.Clone(p.Select[i].Ports)
		p.Select[i].Dests = slices.Clone(p.Select[i].Dests)
	}
	if p.Auto != nil {
		a := *p.Auto
		p.Auto = &a
	}
	if p.Fleet != nil {
		f := *p.Fleet
		p.Fleet = &f
	}
	p.License = p.License.Clone()
	return p
}
