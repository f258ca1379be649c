package tiers

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// LoadFile reads and parses the policy file at path: ParseProperties when
// its name ends in ".properties" (any case), ParseYAML otherwise. An error
// names the path; a *ConfigError within it is reachable with errors.As and
// its sentinel with errors.Is. Returns the *os.PathError of a file that
// cannot be read.
func LoadFile(path string) (Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Policy{}, err
	}
	parse := ParseYAML
	isProps := strings.EqualFold(filepath.Ext(path), ".properties")
	if isProps {
		parse = ParseProperties
	}
	p, err := parse(data)
	if err != nil {
		// A seed-style file under another name fails as YAML: say why.
		if !isProps && bytes.Contains(data, []byte("limiter.")) {
			if _, perr := ParseProperties(data); perr == nil {
				return Policy{}, fmt.Errorf("%s: %w (this is the seed's .properties format: name the file *.properties)", path, err)
			}
		}
		return Policy{}, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}
