package tiers

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ParseProperties parses and validates a policy in the seed's Spring
// .properties format:
//
//	limiter.switch=true          # true: mode enforce; false: mode off
//	limiter.max=40000            # Policy.Max
//	limiter.strategys[0].limit=70 // Tier.At of tier 1, in percent
//	limiter.strategys[0].rate=20  // Tier.Drop of tier 1, in percent
//
// The seed's config block parses as written, trailing "#" and "//" comments
// included, and yields Default(). Indices may come in any order but must run
// 0, 1, 2, … without gaps, and each needs both limit and rate. Keys left out
// take the values of Default(), and so do window, select and exempt, which
// the format cannot express. Keys outside "limiter." belong to the rest of
// the Spring application and are ignored.
//
// Every error is a *ConfigError with the key, value and line. Returns
// ErrSyntax for a line without a key, ErrUnknownKey for any other
// limiter.* key, ErrDuplicateKey for a key given twice, ErrMissingKey for a
// gap in the indices or a strategy without limit or rate, ErrType for a
// value that is not a boolean, integer or percent as the key needs,
// ErrTooMany for an index of MaxTiers or more, and any error of Validate.
func ParseProperties(data []byte) (Policy, error) {
	entries, err := readProperties(data)
	if err != nil {
		return Policy{}, err
	}
	p := Default()
	seen := map[string]propEntry{}
	type strategy struct{ limit, rate *propEntry }
	strategies := map[int]*strategy{}
	for _, e := range entries {
		if !strings.HasPrefix(e.key, "limiter.") {
			continue
		}
		if prev, ok := seen[e.key]; ok {
			return Policy{}, e.err(ErrDuplicateKey, "also on line %d", prev.line)
		}
		seen[e.key] = e
		if e.value == "" {
			return Policy{}, e.err(ErrType, "missing value")
		}
		switch e.key {
		case "limiter.switch":
			switch strings.ToLower(e.value) {
			case "true":
				p.Mode = ModeEnforce
			case "false":
				p.Mode = ModeOff
			default:
				return Policy{}, e.err(ErrType, "want true or false")
			}
			continue
		case "limiter.max":
			if strings.EqualFold(e.value, "auto") {
				return Policy{}, e.err(ErrAuto, "the .properties format has no adaptive max: write the policy in YAML with max: auto and an auto block")
			}
			n, err := strconv.ParseInt(e.value, 10, 64)
			if err != nil {
				if errors.Is(err, strconv.ErrRange) {
					return Policy{}, e.err(ErrMax, "must be from 1 to %d packets", uint64(MaxPackets))
				}
				return Policy{}, e.err(ErrType, "want a whole number of packets")
			}
			if n <= 0 {
				return Policy{}, e.err(ErrMax, "must be from 1 to %d packets", uint64(MaxPackets))
			}
			p.Max = uint64(n)
			continue
		}
		m := strategyKeyRE.FindStringSubmatch(e.key)
		if m == nil {
			return Policy{}, e.err(ErrUnknownKey,
				"want limiter.switch, limiter.max, limiter.strategys[i].limit or limiter.strategys[i].rate")
		}
		i, err := strconv.Atoi(m[1])
		if err != nil || i >= MaxTiers {
			return Policy{}, e.err(ErrTooMany, "index %s: at most %d tiers, indices 0 to %d", m[1], MaxTiers, MaxTiers-1)
		}
		s := strategies[i]
		if s == nil {
			s = &strategy{}
			strategies[i] = s
		}
		// A key "[1]" and a key "[01]" are the same strategy.
		entry := e
		if m[2] == "limit" {
			if s.limit != nil {
				return Policy{}, e.err(ErrDuplicateKey, "also on line %d", s.limit.line)
			}
			s.limit = &entry
		} else {
			if s.rate != nil {
				return Policy{}, e.err(ErrDuplicateKey, "also on line %d", s.rate.line)
			}
			s.rate = &entry
		}
	}

	// keys maps Validate's key paths to the entries they came from.
	keys := map[string]propEntry{}
	if e, ok := seen["limiter.switch"]; ok {
		keys["mode"] = e
	}
	if e, ok := seen["limiter.max"]; ok {
		keys["max"] = e
	}
	if len(strategies) > 0 {
		indices := make([]int, 0, len(strategies))
		for i := range strategies {
			indices = append(indices, i)
		}
		slices.Sort(indices)
		p.Tiers = make([]Tier, len(indices))
		for j, i := range indices {
			s := strategies[i]
			first := s.limit
			if first == nil {
				first = s.rate
			}
			if i != j {
				return Policy{}, &ConfigError{Key: fmt.Sprintf("limiter.strategys[%d]", j), Line: first.line,
					Err: fmt.Errorf("%w: indices must run 0, 1, 2, … without gaps, and strategys[%d] follows strategys[%d]", ErrMissingKey, i, j-1)}
			}
			prefix := fmt.Sprintf("limiter.strategys[%d].", i)
			if s.limit == nil || s.rate == nil {
				missing := "limit"
				if s.limit != nil {
					missing = "rate"
				}
				return Policy{}, &ConfigError{Key: prefix + missing, Line: first.line,
					Err: fmt.Errorf("%w: a strategy needs limit and rate", ErrMissingKey)}
			}
			var err error
			if p.Tiers[j].At, err = parsePercent(s.limit.value); err != nil {
				return Policy{}, s.limit.wrap(err)
			}
			if p.Tiers[j].Drop, err = parsePercent(s.rate.value); err != nil {
				return Policy{}, s.rate.wrap(err)
			}
			keys[fmt.Sprintf("tiers[%d].at", j)] = *s.limit
			keys[fmt.Sprintf("tiers[%d].drop", j)] = *s.rate
			keys[fmt.Sprintf("tiers[%d]", j)] = *s.limit
		}
	}
	if len(seen) == 0 {
		return Policy{}, &ConfigError{Err: fmt.Errorf("%w: no limiter.* key (limiter.switch, limiter.max, limiter.strategys[i].limit and .rate)", ErrEmptyConfig)}
	}
	if err := p.Validate(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			if e, ok := keys[ce.Key]; ok {
				return Policy{}, e.wrap(ce.Err)
			}
		}
		return Policy{}, err
	}
	return p, nil
}

var strategyKeyRE = regexp.MustCompile(`^limiter\.strategys\[([0-9]+)\]\.(limit|rate)$`)

// propEntry is one key and value of a .properties file.
type propEntry struct {
	key, value string
	line       int // of the key
}

func (e propEntry) err(sentinel error, format string, args ...any) *ConfigError {
	ce := configErr(e.key, e.value, sentinel, format, args...)
	ce.Line = e.line
	return ce
}

func (e propEntry) wrap(err error) *ConfigError {
	return &ConfigError{Key: e.key, Value: e.value, Line: e.line, Err: err}
}

// readProperties splits a .properties file into entries, as
// java.util.Properties does for the keys tierlimit reads: lines starting with
// # or ! are comments, a line ending in an odd number of backslashes
// continues on the next, and the key ends at the first '=', ':' or white
// space. Unlike java.util.Properties, and as the seed's config block needs,
// a limiter.* value ends at the first "#" or "//": the rest is a comment.
func readProperties(data []byte) ([]propEntry, error) {
	data = bytes.TrimPrefix(data, []byte("\uFEFF"))
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	var out []propEntry
	lineNo := 0
	for sc.Scan() {
		lineNo++
		start := lineNo
		line := strings.TrimLeft(sc.Text(), " \t\f")
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		for continues(line) && sc.Scan() {
			lineNo++
			line = line[:len(line)-1] + strings.TrimLeft(sc.Text(), " \t\f")
		}
		key, value := line, ""
		if i := strings.IndexAny(line, "=: \t\f"); i >= 0 {
			key = line[:i]
			rest := strings.TrimLeft(line[i:], " \t\f")
			if rest != "" && (rest[0] == '=' || rest[0] == ':') {
				rest = rest[1:]
			}
			value = rest
		}
		if key == "" {
			return nil, &ConfigError{Value: line, Line: start, Err: fmt.Errorf("%w: a line with no key", ErrSyntax)}
		}
		if strings.HasPrefix(key, "limiter.") {
			if i := strings.Index(value, "#"); i >= 0 {
				value = value[:i]
			}
			if i := strings.Index(value, "//"); i >= 0 {
				value = value[:i]
			}
		}
		out = append(out, propEntry{key: key, value: strings.TrimSpace(value), line: start})
	}
	if err := sc.Err(); err != nil {
		return nil, &ConfigError{Line: lineNo + 1, Err: fmt.Errorf("%w: %v", ErrSyntax, err)}
	}
	return out, nil
}

// continues reports whether a line ends in an odd number of backslashes.
func continues(line string) bool {
	n := len(line) - len(strings.TrimRight(line, `\`))
	return n%2 == 1
}
