package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ParseYAML parses and validates a YAML policy (docs/design.md §3). The file is
// read into a yaml.Node tree and walked strictly: unknown and duplicate keys
// are errors, as are values of the wrong kind, and every error carries its
// line. Keys the file leaves out take the values of Default(), but a file
// with no key at all (empty, or only comments) is ErrEmptyConfig. An
// explicitly empty `select: []` or `tiers: []` is an error.
//
// at and drop accept 70, 12.5, "70%" and "12.5%". window is a Go duration.
// ports accept numbers and "first-last" ranges. count defaults to syn for
// tcp rules and to packets for udp rules. A CIDR without a length is one
// host; host bits under the mask are cleared.
//
// Every error is a *ConfigError. Returns ErrSyntax for malformed YAML or
// more than one document, ErrUnknownKey, ErrDuplicateKey, ErrMissingKey,
// ErrType, and any error of Validate, with the line it concerns.
func ParseYAML(data []byte) (Policy, error) {
	return parseYAML(data, defaultPolicy)
}

// parseYAML parses data over base, which supplies the values of omitted keys.
func parseYAML(data []byte, base Policy) (Policy, error) {
	p := base.Clone()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Policy{}, emptyConfig()
		}
		return Policy{}, yamlSyntaxError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return Policy{}, &ConfigError{Line: extra.Line, Err: fmt.Errorf("%w: more than one YAML document", ErrSyntax)}
	} else if !errors.Is(err, io.EOF) {
		return Policy{}, yamlSyntaxError(err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Tag == "!!null" ||
		doc.Content[0].Kind == yaml.MappingNode && len(doc.Content[0].Content) == 0 {
		return Policy{}, emptyConfig()
	}
	ps := yamlParser{lines: map[string]int{}, written: map[string]string{}}
	if len(doc.Content) == 1 {
		if err := ps.policy(doc.Content[0], &p); err != nil {
			return Policy{}, err
		}
	}
	if err := p.Validate(); err != nil {
		return Policy{}, ps.locate(err)
	}
	return p, nil
}

func emptyConfig() error {
	return &ConfigError{Err: fmt.Errorf("%w: write the keys you mean (omitted keys take the defaults)", ErrEmptyConfig)}
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func yamlSyntaxError(err error) error {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &ConfigError{Line: line, Err: fmt.Errorf("%w: %s", ErrSyntax, m[2])}
	}
	return &ConfigError{Err: fmt.Errorf("%w: %s", ErrSyntax, strings.TrimPrefix(msg, "yaml: "))}
}

// yamlParser walks the node tree. lines maps each key path it met to the
// line of its value, so that Validate's errors can be located.
type yamlParser struct {
	lines map[string]int
	// written holds the value as written of keys whose value the policy
	// cannot hold as written (packets, the window: 2h is 2h0m0s), for
	// Validate's errors.
	written map[string]string
	// units are the values written with a byte unit, in the order met.
	units []unitAt
}

// packets reads a whole number of packets or bytes: an !!int scalar, or
// a size with a byte unit such as 500MB (ParseSize), which Validate
// range-checks (checkPackets): a negative count reads as 0 and one past
// int64 as MaxPackets+1, and the error names the value as written. A size
// with a unit is remembered (units), so that a policy that counts packets
// refuses it (unitErr); text that is no size is ErrType naming want.
func (ps *yamlParser) packets(key string, v *yaml.Node, want string) (uint64, error) {
	ps.written[key] = nodeValue(v)
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" {
		n, unit, err := ParseSize(v.Value)
		switch {
		case errors.Is(err, ErrSize) && unit:
			ps.units = append(ps.units, unitAt{key, v})
			return min(n, MaxPackets+1), nil
		case err != nil || !unit: // a number in quotes is text, as before units
			return 0, typeErr(key, v, want)
		}
		ps.units = append(ps.units, unitAt{key, v})
		return min(n, MaxPackets+1), nil
	}
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" {
		return 0, typeErr(key, v, want)
	}
	var i int64
	switch err := v.Decode(&i); {
	case err != nil:
		return MaxPackets + 1, nil
	case i < 0:
		return 0, nil
	}
	return uint64(i), nil
}

// unitAt is a value written with a byte unit, and its key.
type unitAt struct {
	key string
	v   *yaml.Node
}

// unitErr refuses the first byte unit of a policy that counts packets
// (ErrUnit), naming its key and value.
func (ps *yamlParser) unitErr(p *Policy) error {
	if p.Count == CountBytes || len(ps.units) == 0 {
		return nil
	}
	u := ps.units[0]
	return valueErr(u.key, u.v, ErrUnit, "a byte unit needs count: bytes (this policy counts %s); write count: bytes, or a whole number of packets", p.Count)
}

// locate fills in the line of a Validate error from the key, or from the
// closest enclosing key that has one.
func (ps *yamlParser) locate(err error) error {
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Line != 0 {
		return err
	}
	located := *ce
	if w, ok := ps.written[ce.Key]; ok {
		located.Value = w
	}
	for key := ce.Key; key != ""; key = parentKey(key) {
		if line, ok := ps.lines[key]; ok {
			located.Line = line
			break
		}
	}
	return &located
}

// parentKey strips the last ".name" or "[i]" from a key path.
func parentKey(key string) string {
	i := strings.LastIndexAny(key, ".[")
	if i < 0 {
		return ""
	}
	return key[:i]
}

// resolve follows aliases, so that *anchor works wherever a value does.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// kindName names what a node is, for "want X, got Y" messages.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing"
		case "!!str":
			return "text"
		case "!!int", "!!float":
			return "a number"
		case "!!bool":
			return "a boolean"
		}
		return "a scalar " + n.ShortTag()
	}
	return "an alias"
}

// nodeValue is the value of a node as ConfigError.Value shows it.
func nodeValue(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Value
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			return "[]"
		}
		return "[...]"
	case yaml.MappingNode:
		if len(n.Content) == 0 {
			return "{}"
		}
		return "{...}"
	}
	return ""
}

func typeErr(key string, n *yaml.Node, want string) *ConfigError {
	ce := configErr(key, nodeValue(n), ErrType, "want %s, got %s", want, kindName(n))
	ce.Line = n.Line
	return ce
}

func valueErr(key string, n *yaml.Node, sentinel error, format string, args ...any) *ConfigError {
	ce := configErr(key, nodeValue(n), sentinel, format, args...)
	ce.Line = n.Line
	return ce
}

// field handles the value of one known key of a mapping; key is its path.
type field struct {
	name string
	set  func(key string, v *yaml.Node) error
}

// mapping walks mapping node n at path, calling each field's set for the
// keys present and failing on unknown or duplicate keys. It returns the set
// of names present.
func (ps *yamlParser) mapping(path string, n *yaml.Node, fields []field) (map[string]bool, error) {
	if n.Kind != yaml.MappingNode {
		return nil, typeErr(path, n, "a mapping")
	}
	seen := make(map[string]bool, len(fields))
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return nil, typeErr(path, k, "a key")
		}
		key := k.Value
		if path != "" {
			key = path + "." + k.Value
		}
		var f *field
		for j := range fields {
			if fields[j].name == k.Value {
				f = &fields[j]
				break
			}
		}
		if f == nil {
			names := make([]string, len(fields))
			for j := range fields {
				names[j] = fields[j].name
			}
			return nil, &ConfigError{Key: key, Line: k.Line,
				Err: fmt.Errorf("%w: want one of %s", ErrUnknownKey, strings.Join(names, ", "))}
		}
		if seen[k.Value] {
			return nil, &ConfigError{Key: key, Line: k.Line, Err: ErrDuplicateKey}
		}
		seen[k.Value] = true
		ps.lines[key] = v.Line
		if err := f.set(key, v); err != nil {
			return nil, err
		}
	}
	return seen, nil
}

// sequence checks that n is a list of at most limit items (limit 0: no
// limit) and records the line of each item.
func (ps *yamlParser) sequence(key string, n *yaml.Node, limit int, what string) ([]*yaml.Node, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, typeErr(key, n, "a list")
	}
	if limit > 0 && len(n.Content) > limit {
		return nil, valueErr(key, n, ErrTooMany, "%d %s, at most %d", len(n.Content), what, limit)
	}
	items := make([]*yaml.Node, len(n.Content))
	for i, item := range n.Content {
		items[i] = resolve(item)
		ps.lines[fmt.Sprintf("%s[%d]", key, i)] = items[i].Line
	}
	return items, nil
}

// choice parses n as one of opts' names (want lists them for the
// errors) and returns its value. Returns errNotIn, naming key and the
// value, for a name not in opts.
func choice[T any](key string, n *yaml.Node, want string, opts map[string]T, errNotIn error) (T, error) {
	var zero T
	s, err := scalar(key, n, want)
	if err != nil {
		return zero, err
	}
	v, ok := opts[s]
	if !ok {
		return zero, valueErr(key, n, errNotIn, "want %s", want)
	}
	return v, nil
}

// scalar returns the text of a scalar node that is not null.
func scalar(key string, n *yaml.Node, want string) (string, error) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		return "", typeErr(key, n, want)
	}
	return n.Value, nil
}

// policy walks the top-level mapping into p, one parser per key (the
// longer ones are named functions below), then applies max: auto.
func (ps *yamlParser) policy(root *yaml.Node, p *Policy) error {
	root = resolve(root)
	if isNull(root) {
		return nil
	}
	var (
		isAuto    bool
		autoBlock *yaml.Node
	)
	_, err := ps.mapping("", root, []field{
		{"mode", func(key string, v *yaml.Node) error { return modeField(key, v, p) }},
		{"shape", func(key string, v *yaml.Node) error { return shapeField(key, v, p) }},
		{"window", func(key string, v *yaml.Node) error {
			ps.written[key] = nodeValue(v)
			return windowField(key, v, p)
		}},
		{"max", func(key string, v *yaml.Node) (err error) {
			if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" && v.Value == "auto" {
				isAuto = true
				return nil
			}
			p.Max, err = ps.packets(key, v, "a whole number of packets (or a size such as 500MB under count: bytes), or auto")
			return err
		}},
		{"count", func(key string, v *yaml.Node) (err error) {
			p.Count, err = choice(key, v, "packets or bytes", map[string]Count{"packets": CountPackets, "bytes": CountBytes}, ErrCount)
			return err
		}},
		{"tiers", func(key string, v *yaml.Node) error {
			tiers, err := ps.tiers(key, v)
			p.Tiers = tiers
			return err
		}},
		{"select", func(key string, v *yaml.Node) error {
			rules, err := ps.rules(key, v)
			p.Select = rules
			return err
		}},
		{"severity", func(key string, v *yaml.Node) (err error) {
			p.Severity, err = ps.severity(key, v)
			return err
		}},
		{"exempt", func(key string, v *yaml.Node) error { return ps.exempt(key, v, p) }},
		{"sources", func(key string, v *yaml.Node) (err error) {
			p.Sources, err = ps.sources(key, v)
			return err
		}},
		{"auto", func(key string, v *yaml.Node) error {
			autoBlock = v
			return nil
		}},
		{"record", func(key string, v *yaml.Node) error {
			return ps.record(key, v, &p.Record)
		}},
		{"events", func(key string, v *yaml.Node) error {
			return ps.events(key, v, &p.Events)
		}},
		{"fleet", func(key string, v *yaml.Node) (err error) {
			p.Fleet, err = ps.fleet(key, v)
			return err
		}},
	})
	if err != nil {
		return err
	}
	if err := ps.autoYAML(p, isAuto, autoBlock); err != nil {
		return err
	}
	return ps.unitErr(p)
}

// modeField parses policy key mode into p.Mode.
func modeField(key string, v *yaml.Node, p *Policy) error {
	s, err := scalar(key, v, "enforce, dry-run or off")
	if err != nil {
		return err
	}
	m, err := ParseMode(s)
	if err != nil {
		return valueErr(key, v, ErrMode, "want enforce, dry-run or off")
	}
	p.Mode = m
	return nil
}

// shapeField parses policy key shape into p.Shape.
func shapeField(key string, v *yaml.Node, p *Policy) error {
	s, err := scalar(key, v, "smooth or ordinal")
	if err != nil {
		return err
	}
	sh, err := ParseShape(s)
	if err != nil {
		return valueErr(key, v, ErrShape, "want smooth or ordinal")
	}
	p.Shape = sh
	return nil
}

// windowField parses policy key window into p.Window.
func windowField(key string, v *yaml.Node, p *Policy) error {
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
		return typeErr(key, v, "a duration such as 1s or 500ms")
	}
	d, err := time.ParseDuration(v.Value)
	if err != nil {
		return valueErr(key, v, ErrWindow, "want a duration such as 1s or 500ms")
	}
	p.Window = d
	return nil
}

// exempt parses the exempt mapping (its one key, sources) into p.Exempt.
func (ps *yamlParser) exempt(key string, v *yaml.Node, p *Policy) error {
	p.Exempt = nil
	if isNull(v) {
		return nil
	}
	_, err := ps.mapping(key, v, []field{
		{"sources", func(key string, v *yaml.Node) error {
			if isNull(v) {
				return nil
			}
			pfx, err := ps.prefixes(key, v)
			p.Exempt = pfx
			return err
		}},
	})
	return err
}

func (ps *yamlParser) tiers(key string, v *yaml.Node) ([]Tier, error) {
	if isNull(v) || v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
		return nil, valueErr(key, v, ErrEmptyTiers, "a policy needs at least one tier")
	}
	items, err := ps.sequence(key, v, MaxTiers, "tiers")
	if err != nil {
		return nil, err
	}
	tiers := make([]Tier, len(items))
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", key, i)
		t := &tiers[i]
		seen, err := ps.mapping(path, item, []field{
			{"at", func(key string, v *yaml.Node) (err error) {
				t.At, err = percentNode(key, v)
				return err
			}},
			{"drop", func(key string, v *yaml.Node) (err error) {
				t.Drop, err = percentNode(key, v)
				return err
			}},
		})
		if err != nil {
			return nil, err
		}
		for _, name := range []string{"at", "drop"} {
			if !seen[name] {
				return nil, &ConfigError{Key: path + "." + name, Line: item.Line,
					Err: fmt.Errorf("%w: a tier needs at and drop", ErrMissingKey)}
			}
		}
	}
	return tiers, nil
}

// percentNode parses at or drop: a number or text like "70%" or "12.5%".
func percentNode(key string, v *yaml.Node) (Percent, error) {
	s, err := scalar(key, v, "a percent such as 70 or 12.5%")
	if err != nil {
		return Percent{}, err
	}
	pc, err := ParsePercent(s)
	if err != nil {
		return Percent{}, &ConfigError{Key: key, Value: s, Line: v.Line, Err: err}
	}
	return pc, nil
}
