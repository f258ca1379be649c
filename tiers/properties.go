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
	ps := propsParser{p: Default(), seen: map[string]propEntry{}, strategies: map[int]*strategy{}, keys: map[string]propEntry{}}
	for _, e := range entries {
		if !strings.HasPrefix(e.key, "limiter.") {
			continue
		}
		if err := ps.entry(e); err != nil {
			return Policy{}, err
		}
	}
	if len(ps.seen) == 0 {
		return Policy{}, &ConfigError{Err: fmt.Errorf("%w: no limiter.* key (limiter.switch, limiter.max, limiter.strategys[i].limit and .rate)", ErrEmptyConfig)}
	}
	if err := ps.tiers(); err != nil {
		return Policy{}, err
	}
	return ps.validate()
}

// propsParser holds what ParseProperties has read so far.
type propsParser struct {
	p          Policy
	seen       map[string]propEntry // limiter.* entries by key
	strategies map[int]*strategy    // by index
	// keys maps Validate's key paths to the entries they came from.
	keys map[string]propEntry
}

// strategy is one limiter.strategys[i]: its limit and rate entries.
type strategy struct{ limit, rate *propEntry }

// entry reads one limiter.* entry.
func (ps *propsParser) entry(e propEntry) error {
	if prev, ok := ps.seen[e.key]; ok {
		return e.err(ErrDuplicateKey, "also on line %d", prev.line)
	}
	ps.seen[e.key] = e
	if e.value == "" {
		return e.err(ErrType, "missing value")
	}
	switch e.key {
	case "limiter.switch":
		ps.keys["mode"] = e
		return ps.modeSwitch(e)
	case "limiter.max":
		ps.keys["max"] = e
		return ps.max(e)
	}
	m := strategyKeyRE.FindStringSubmatch(e.key)
	if m == nil {
		return e.err(ErrUnknownKey,
			"want limiter.switch, limiter.max, limiter.strategys[i].limit or limiter.strategys[i].rate")
	}
	return ps.strategyEntry(e, m[1], m[2])
}

// modeSwitch reads limiter.switch: true is enforce, false is off.
func (ps *propsParser) modeSwitch(e propEntry) error {
	switch strings.ToLower(e.value) {
	case "true":
		ps.p.Mode = ModeEnforce
	case "false":
		ps.p.Mode = ModeOff
	default:
		return e.err(ErrType, "want true or false")
	}
	return nil
}

// max reads limiter.max, a whole number of packets.
func (ps *propsParser) max(e propEntry) error {
	if strings.EqualFold(e.value, "auto") {
		return e.err(ErrAuto, "the .properties format has no adaptive max: write the policy in YAML with max: auto and an auto block")
	}
	n, err := strconv.ParseInt(e.value, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return e.err(ErrType, "want a whole number of packets")
	}
	// Validate checks the range, and validate names this entry: a negative
	// count reads as 0, one past int64 as ParseInt's MaxInt64.
	ps.p.Max = uint64(max(n, 0))
	return nil
}

// strategyEntry reads limiter.strategys[index].field (limit or rate).
func (ps *propsParser) strategyEntry(e propEntry, index, field string) error {
	i, err := strconv.Atoi(index)
	if err != nil || i >= MaxTiers {
		return e.err(ErrTooMany, "index %s: at most %d tiers, indices 0 to %d", index, MaxTiers, MaxTiers-1)
	}
	s := ps.strategies[i]
	if s == nil {
		s = &strategy{}
		ps.strategies[i] = s
	}
	// A key "[1]" and a key "[01]" are the same strategy.
	slot := &s.rate
	if field == "limit" {
		slot = &s.limit
	}
	if *slot != nil {
		return e.err(ErrDuplicateKey, "also on line %d", (*slot).line)
	}
	entry := e
	*slot = &entry
	return nil
}

// tiers turns the strategies into the policy's tiers, in index order. The
// indices must run 0, 1, 2, … and each strategy needs limit and rate.
func (ps *propsParser) tiers() error {
	if len(ps.strategies) == 0 {
		return nil
	}
	indices := make([]int, 0, len(ps.strategies))
	for i := range ps.strategies {
		indices = append(indices, i)
	}
	slices.Sort(indices)
	ps.p.Tiers = make([]Tier, len(indices))
	for j, i := range indices {
		s := ps.strategies[i]
		first := s.limit
		if first == nil {
			first = s.rate
		}
		if i != j {
			return &ConfigError{Key: fmt.Sprintf("limiter.strategys[%d]", j), Line: first.line,
				Err: fmt.Errorf("%w: strategys[%d] is missing, and strategys[%d] is set: indices must run 0, 1, 2, … without gaps", ErrMissingKey, j, i)}
		}
		if s.limit == nil || s.rate == nil {
			missing := "limit"
			if s.limit != nil {
				missing = "rate"
			}
			return &ConfigError{Key: fmt.Sprintf("limiter.strategys[%d].%s", i, missing), Line: first.line,
				Err: fmt.Errorf("%w: a strategy needs limit and rate", ErrMissingKey)}
		}
		var err error
		if ps.p.Tiers[j].At, err = ParsePercent(s.limit.value); err != nil {
			return s.limit.wrap(err)
		}
		if ps.p.Tiers[j].Drop, err = ParsePercent(s.rate.value); err != nil {
			return s.rate.wrap(err)
		}
		ps.keys[fmt.Sprintf("tiers[%d].at", j)] = *s.limit
		ps.keys[fmt.Sprintf("tiers[%d].drop", j)] = *s.rate
		ps.keys[fmt.Sprintf("tiers[%d]", j)] = *s.limit
	}
	return nil
}

// validate validates the policy, naming the .properties key and line of
// an error where Validate's key came from one.
func (ps *propsParser) validate() (Policy, error) {
	if err := ps.p.Validate(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			if e, ok := ps.keys[ce.Key]; ok {
				return Policy{}, e.wrap(ce.Err)
			}
		}
		return Policy{}, err
	}
	return ps.p, nil
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
