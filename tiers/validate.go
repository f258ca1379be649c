package tiers

import (
	"fmt"
	"net/netip"
	"strconv"
)

// checkPackets is the one range check of a count of packets per window
// (max, fleet.max and the auto block's bounds), or of bytes when c is
// CountBytes: from 1 to MaxPackets. The parsers leave it to Validate, and
// name the value as written.
func checkPackets(key string, n uint64, sentinel error, c Count) *ConfigError {
	if n == 0 || n > MaxPackets {
		return configErr(key, strconv.FormatUint(n, 10), sentinel, "must be from 1 to %d %s", uint64(MaxPackets), c.Unit())
	}
	return nil
}

// configErr builds a *ConfigError whose Err wraps sentinel, followed by the
// formatted detail when format is not empty.

func configErr(key, value string, sentinel error, format string, args ...any) *ConfigError {
	err := sentinel
	if format != "" {
		err = fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
	}
	return &ConfigError{Key: key, Value: value, Err: err}
}

// Validate checks a policy against docs/design.md §2 and §3 and returns the
// first fault as a *ConfigError (Line 0; the parsers fill it in), or nil.
// Keys are named as in YAML: "mode", "tiers[1].at", "select[0].ports[2]".
//
// Returns ErrMode for an undefined Mode; ErrCount for a Count other than
// CountPackets or CountBytes; ErrWindow when Window is not in
// (0, MaxWindow]; ErrMax when Max is not in [1, MaxPackets]; ErrEmptyTiers
// for no tiers; ErrTooMany for more than MaxTiers tiers or MaxSelectRules
// rules; ErrPercentRange when an At is not in (0, MaxAtPercent], a Drop not
// in [0, 100]; ErrTierOrder when
// At does not strictly increase; ErrEmptySelect for no select rules;
// ErrProto for a protocol other than tcp or udp; ErrPort for a rule without
// ports, a port 0 or a range with First > Last; ErrCIDR for an invalid
// prefix in Dests or Exempt; ErrCount for an undefined Count, or CountSYN on
// a udp rule (the seed counted requests; only TCP has connection attempts);
// ErrBudget and ErrPrefixLen for Sources out of range.
// ErrAuto for an Auto whose bounds are out of order or range, a Max outside
// them, no udp rule, or a NetNS that is not an absolute path.
// ErrFleet, ErrMissingKey and ErrMax for a Fleet out of range (Fleet).
func (p Policy) Validate() error {
	switch p.Mode {
	case ModeEnforce, ModeDryRun, ModeOff:
	default:
		return configErr("mode", p.Mode.String(), ErrMode, "want enforce, dry-run or off")
	}
	if p.Shape != ShapeOrdinal && p.Shape != ShapeSmooth {
		return configErr("shape", p.Shape.String(), ErrShape, "want smooth or ordinal")
	}
	if p.Window <= 0 || p.Window > MaxWindow {
		return configErr("window", p.Window.String(), ErrWindow, "must be more than 0 and at most %s", MaxWindow)
	}
	if p.Shape == ShapeSmooth && p.Window < SmoothMinWindow {
		return configErr("window", p.Window.String(), ErrWindow,
			"shape smooth needs a window of at least %s: its estimate counts the window in kernel ticks (10ms at HZ 100), and a window of fewer than 20 ticks would pass up to twice P(R); set shape: ordinal for a shorter window", SmoothMinWindow)
	}
	if p.Count != CountPackets && p.Count != CountBytes {
		return configErr("count", p.Count.String(), ErrCount, "want packets or bytes")
	}
	if p.Auto != nil {
		if err := p.Auto.checkRange(p.Count); err != nil {
			return err
		}
	}
	if err := checkPackets("max", p.Max, ErrMax, p.Count); err != nil {
		return err
	}
	if err := p.validateTiers(); err != nil {
		return err
	}
	if len(p.Select) == 0 {
		return configErr("select", "", ErrEmptySelect, "a policy needs at least one select rule")
	}
	if len(p.Select) > MaxSelectRules {
		return configErr("select", "", ErrTooMany, "%d rules, at most %d", len(p.Select), MaxSelectRules)
	}
	for i, r := range p.Select {
		if err := r.validate(fmt.Sprintf("select[%d]", i)); err != nil {
			return err
		}
	}
	if err := p.Severity.validate(); err != nil {
		return err
	}
	if err := p.validatePrefixes(); err != nil {
		return err
	}
	if err := p.Sources.validate(p.Max, p.Count); err != nil {
		return err
	}
	if err := p.Record.validate(); err != nil {
		return err
	}
	if err := p.Fleet.validate(p); err != nil {
		return err
	}
	if p.Auto != nil {
		return p.Auto.validate(p)
	}
	return nil
}

// validateTiers checks tiers: one to MaxTiers, at in (0, MaxAtPercent],
// drop in [0, 100], at strictly increasing.
func (p Policy) validateTiers() error {
	if len(p.Tiers) == 0 {
		return configErr("tiers", "", ErrEmptyTiers, "a policy needs at least one tier")
	}
	if len(p.Tiers) > MaxTiers {
		return configErr("tiers", "", ErrTooMany, "%d tiers, at most %d", len(p.Tiers), MaxTiers)
	}
	for i, t := range p.Tiers {
		key := fmt.Sprintf("tiers[%d]", i)
		if t.At.micro <= 0 || t.At.micro > MaxAtPercent*microPerPercent {
			return configErr(key+".at", t.At.String(), ErrPercentRange,
				"at must be more than 0%% and at most %d%%", MaxAtPercent)
		}
		if t.Drop.micro < 0 || t.Drop.micro > microHundred {
			return configErr(key+".drop", t.Drop.String(), ErrPercentRange, "drop must be from 0%% to 100%%")
		}
		if i > 0 && t.At.micro <= p.Tiers[i-1].At.micro {
			return configErr(key+".at", t.At.String(), ErrTierOrder,
				"at must be greater than tiers[%d].at (%s)", i-1, p.Tiers[i-1].At)
		}
	}
	return nil
}

// validatePrefixes checks the prefix counts of the tries (MaxPrefixes
// exempt sources and dests over all rules, LocalBudget destinations of
// dests: local, each counted once however many rules name it) and each
// exempt prefix.
func (p Policy) validatePrefixes() error {
	if len(p.Exempt) > MaxPrefixes {
		return configErr("exempt.sources", "", ErrTooMany, "%d prefixes, at most %d", len(p.Exempt), MaxPrefixes)
	}
	dests := 0
	for _, r := range p.Select {
		dests += len(r.Dests)
	}
	if dests > MaxPrefixes {
		return configErr("select", "", ErrTooMany, "%d dests prefixes over all rules, at most %d", dests, MaxPrefixes)
	}
	budget := LocalBudget(p)
	if local := DestEntries(p) - (MaxPrefixes + MaxLocalPrefixes - budget); local > budget {
		return configErr("select", "local", ErrTooMany, "the host's %d destinations over all dests: local rules, at most %d", local, budget)
	}
	for i, pfx := range p.Exempt {
		if err := checkPrefix(fmt.Sprintf("exempt.sources[%d]", i), pfx); err != nil {
			return err
		}
	}
	return nil
}

// checkPrefix refuses an invalid prefix, and an IPv4-mapped one
// (::ffff:0:0/96 and longer): a prefix matches packets of its own family
// only, so an IPv4-mapped IPv6 prefix would match no IPv4 packet, only
// IPv6 packets whose address is IPv4-mapped, which is never what the
// writer meant.
func checkPrefix(key string, pfx netip.Prefix) error {
	if !pfx.IsValid() {
		return configErr(key, pfx.String(), ErrCIDR, "invalid prefix")
	}
	if msg := mappedPrefix(pfx); msg != "" {
		return configErr(key, pfx.String(), ErrCIDR, "%s", msg)
	}
	return nil
}

// mappedPrefix explains why an IPv4-mapped prefix is refused, or returns "".
func mappedPrefix(pfx netip.Prefix) string {
	if !pfx.Addr().Is4In6() || pfx.Bits() < 96 {
		return ""
	}
	v4 := netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96).Masked()
	return fmt.Sprintf("an IPv4-mapped prefix matches no IPv4 packet (a prefix matches its own family only): write %s for IPv4 packets", v4)
}

func (r Rule) validate(key string) error {
	if r.Proto != ProtoTCP && r.Proto != ProtoUDP {
		return configErr(key+".proto", r.Proto.String(), ErrProto, "want udp or tcp")
	}
	if len(r.Ports) == 0 {
		return configErr(key+".ports", "", ErrPort, "a rule needs at least one port")
	}
	for j, pr := range r.Ports {
		if pr.First == 0 || pr.First > pr.Last {
			return configErr(fmt.Sprintf("%s.ports[%d]", key, j), fmt.Sprintf("%d-%d", pr.First, pr.Last), ErrPort,
				"want a port from 1 to 65535, or a range first-last with first <= last")
		}
	}
	for j, pfx := range r.Dests {
		if err := checkPrefix(fmt.Sprintf("%s.dests[%d]", key, j), pfx); err != nil {
			return err
		}
	}
	switch r.Count {
	case CountPackets:
	case CountSYN:
		if r.Proto != ProtoTCP {
			return configErr(key+".count", r.Count.String(), ErrCount, "count syn is for tcp rules only")
		}
	default:
		return configErr(key+".count", r.Count.String(), ErrCount, "want packets or syn")
	}
	return nil
}
