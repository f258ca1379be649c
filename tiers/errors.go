package tiers

import (
	"errors"
	"strconv"
	"strings"
	"unicode"
)

// Sentinel errors. Every error that ParseYAML, ParseProperties, LoadFile,
// Validate and Compile return for a bad policy is a *ConfigError that wraps
// exactly one of these; test for them with errors.Is.
var (
	// ErrSyntax: the file is not well-formed YAML or .properties (a line
	// without a key, a second YAML document, ...).
	ErrSyntax = errors.New("syntax error")
	// ErrUnknownKey: a key that the format does not define (strict mode).
	ErrUnknownKey = errors.New("unknown key")
	// ErrDuplicateKey: the same key twice in one mapping or file.
	ErrDuplicateKey = errors.New("duplicate key")
	// ErrMissingKey: a required key is absent: a tier without at or drop, a
	// select rule without proto or ports, or a gap in the seed's
	// limiter.strategys[i] indices.
	ErrMissingKey = errors.New("missing key")
	// ErrType: a value of the wrong kind, such as a list where a number is
	// expected, or text that is not a number.
	ErrType = errors.New("wrong type")
	// ErrTierOrder: a tier's at is not strictly greater than the previous
	// tier's (tiers are in config order, docs/design.md §2).
	ErrTierOrder = errors.New("tiers out of order")
	// ErrEmptyConfig: the file holds no policy at all (empty, or only
	// comments; for .properties, no limiter.* key). A truncated or
	// half-rendered file must not silently become the default policy.
	ErrEmptyConfig = errors.New("config holds no policy")
	// ErrEmptyTiers: tiers is present but empty.
	ErrEmptyTiers = errors.New("empty tiers")
	// ErrPercentRange: a percent outside its range: at must be in
	// (0, MaxAtPercent], drop in [0, 100]; or finer than 0.000001 percent
	// (at most six decimal places), which Compile could not do exactly.
	ErrPercentRange = errors.New("percent out of range")
	// ErrMax: max is not in [1, MaxPackets] packets (or bytes under
	// count: bytes).
	ErrMax = errors.New("max out of range")
	// ErrEmptySelect: select is present but empty; a policy that selects
	// nothing is almost certainly a mistake.
	ErrEmptySelect = errors.New("empty select")
	// ErrCIDR: an address prefix that net/netip cannot parse.
	ErrCIDR = errors.New("bad CIDR")
	// ErrPort: a port of 0 or over 65535, a range whose first port is
	// greater than its last, or a rule with no ports.
	ErrPort = errors.New("bad port")
	// ErrProto: a protocol other than udp or tcp.
	ErrProto = errors.New("unknown proto")
	// ErrMode: a mode other than enforce, dry-run or off.
	ErrMode = errors.New("unknown mode")
	// ErrCount: a rule's count other than packets or syn, or count: syn on
	// a udp rule (only TCP has connection attempts); or a policy's count
	// other than packets or bytes.
	ErrCount = errors.New("bad count")
	// ErrShape: a shape other than smooth or ordinal.
	ErrShape = errors.New("unknown shape")
	// ErrWindow: a window that is not a Go duration, or not in (0, 1h].
	ErrWindow = errors.New("bad window")
	// ErrTooMany: more than MaxTiers tiers or more than MaxSelectRules
	// select rules, the sizes the BPF program is built with.
	ErrTooMany = errors.New("too many entries")
	// ErrBudget: a sources budget that is not a percent in (0, 100] or a
	// packet count in [1, max], or a percent of max under one packet.
	ErrBudget = errors.New("bad budget")
	// ErrSize: a size of 0, or one no uint64 holds (ParseSize).
	ErrSize = errors.New("bad size")
	// ErrUnit: a byte unit (500MB) on a policy that counts packets: the
	// unit needs count: bytes (docs/design.md §3).
	ErrUnit = errors.New("byte unit on a packet policy")
	// ErrPrefixLen: a sources prefix length outside 1..32 (prefix_v4) or
	// 1..128 (prefix_v6).
	ErrPrefixLen = errors.New("bad prefix length")
)

// ConfigError is a policy error located in its source. Its Error reads like
//
//	line 7: tiers[1].at: "60%": tiers out of order: at must be greater than tiers[0].at (70%)
//
// and Unwrap reaches one of the sentinel errors (ErrTierOrder here).
type ConfigError struct {
	// Key is the path of the offending key, such as "tiers[1].at",
	// "select[0].ports[2]" or, for .properties, "limiter.strategys[1].limit".
	Key string
	// Value is the offending value as written, or "" when there is none
	// (an unknown or missing key).
	Value string
	// Line is the 1-based line in the source, or 0 when unknown (a Policy
	// built in Go and checked with Validate).
	Line int
	// Err wraps the sentinel error, with any detail.
	Err error
}

// Error returns the one-line form "line L: key: "value": error", leaving
// out the parts that are unknown. A key with characters other than printable
// ones is quoted, and line breaks in the error are replaced, so the message
// is always one line.
func (e *ConfigError) Error() string {
	var b []byte
	if e.Line > 0 {
		b = append(b, "line "...)
		b = strconv.AppendInt(b, int64(e.Line), 10)
		b = append(b, ": "...)
	}
	if e.Key != "" {
		if strings.IndexFunc(e.Key, func(r rune) bool { return !unicode.IsPrint(r) || r == ' ' }) >= 0 {
			b = strconv.AppendQuote(b, e.Key)
		} else {
			b = append(b, e.Key...)
		}
		b = append(b, ": "...)
	}
	if e.Value != "" {
		b = strconv.AppendQuote(b, e.Value)
		b = append(b, ": "...)
	}
	if e.Err != nil {
		b = append(b, strings.Join(strings.Fields(e.Err.Error()), " ")...)
	} else {
		b = append(b, "invalid"...)
	}
	return string(b)
}

// Unwrap returns Err, so errors.Is finds the sentinel.
func (e *ConfigError) Unwrap() error { return e.Err }
