package tiers

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// ErrSeverity: a severity that is not a syslog severity name or a number
// 0..7, one listed twice, or one both protected and shed first.
var ErrSeverity = errors.New("bad severity")

// SeverityClass is how severity-aware shedding (docs/design.md §7) treats a UDP
// syslog datagram, by the severity of its <PRI>. Its values are the XDP
// program's enum tl_sev_class.
type SeverityClass uint8

const (
	// SevNormal datagrams are judged by the tiers as without severity:
	// severities in no list, and datagrams with no valid <PRI>.
	SevNormal SeverityClass = iota
	// SevProtected datagrams pass when their tier says drop, while the
	// window's drop debt is under the protect budget.
	SevProtected
	// SevShedFirst datagrams are judged at the next tier's drop rate in
	// tiers >= 1, and always dropped in the last tier.
	SevShedFirst
	// NumSeverityClasses is the number of classes.
	NumSeverityClasses = 3
)

// SeverityClasses lists the classes in order, for metrics and status.
var SeverityClasses = [NumSeverityClasses]SeverityClass{SevNormal, SevProtected, SevShedFirst}

// String returns "normal", "protected" or "shed_first".
func (c SeverityClass) String() string {
	switch c {
	case SevNormal:
		return "normal"
	case SevProtected:
		return "protected"
	case SevShedFirst:
		return "shed_first"
	}
	return "SeverityClass(" + strconv.Itoa(int(c)) + ")"
}

// severityNames are the syslog severity keywords of RFC 5424 §6.2.1 table 2
// (and syslog.conf), indexed by severity.
var severityNames = [8]string{"emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"}

// severityAliases are the other spellings syslog.conf accepts.
var severityAliases = map[string]int{"panic": 0, "error": 3, "warn": 4}

// SeverityName returns the keyword of syslog severity s (0..7): "emerg" ..
// "debug".
func SeverityName(s int) string {
	if s < 0 || s > 7 {
		return "severity(" + strconv.Itoa(s) + ")"
	}
	return severityNames[s]
}

// ParseSeverity parses a syslog severity keyword (emerg, alert, crit, err,
// warning, notice, info, debug, and the aliases panic, error, warn) or a
// number 0..7. Returns an error wrapping ErrSeverity for anything else.
func ParseSeverity(s string) (int, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if i := slices.Index(severityNames[:], s); i >= 0 {
		return i, nil
	}
	if i, ok := severityAliases[s]; ok {
		return i, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 7 && s == strconv.Itoa(n) {
		return n, nil
	}
	return 0, fmt.Errorf("%w %q: want a name (emerg, alert, crit, err, warning, notice, info, debug) or 0-7", ErrSeverity, s)
}

// Severity configures severity-aware shedding (`severity:`, docs/design.md §7).
// It applies to UDP select rules only: TCP rules count connection attempts,
// which carry no syslog message.
type Severity struct {
	// Protect lists the protected severities, 0..7.
	Protect []int
	// ProtectBudget is the most packets per window, as a percent of max,
	// that protection may pass over the tiers' verdict: the window's drop
	// debt stays at or under floor(max × ProtectBudget / 100).
	ProtectBudget Percent
	// ShedFirst lists the severities shed first, 0..7.
	ShedFirst []int
	// ProtectFacilities lists the facilities, 0..23 (facility.go), whose
	// datagrams are protected whatever their severity.
	ProtectFacilities []int
}

// Clone returns a deep copy of s (nil for nil).
func (s *Severity) Clone() *Severity {
	if s == nil {
		return nil
	}
	c := *s
	c.Protect, c.ShedFirst = slices.Clone(s.Protect), slices.Clone(s.ShedFirst)
	c.ProtectFacilities = slices.Clone(s.ProtectFacilities)
	return &c
}

// ClassOf returns the class of syslog severity sev (0..7), or SevNormal
// for any other value, such as -1 for a datagram without a valid <PRI>.
func (s *Severity) ClassOf(sev int) SeverityClass {
	switch {
	case s == nil || sev < 0 || sev > 7:
		return SevNormal
	case slices.Contains(s.Protect, sev):
		return SevProtected
	case slices.Contains(s.ShedFirst, sev):
		return SevShedFirst
	}
	return SevNormal
}

// validate checks the lists and the budget; keys are named as in YAML.
func (s *Severity) validate() error {
	if s == nil {
		return nil
	}
	seen := map[int]string{}
	for _, l := range []struct {
		key  string
		sevs []int
	}{{"severity.protect", s.Protect}, {"severity.shed_first", s.ShedFirst}} {
		for i, v := range l.sevs {
			key := fmt.Sprintf("%s[%d]", l.key, i)
			if v < 0 || v > 7 {
				return configErr(key, strconv.Itoa(v), ErrSeverity, "want a severity from 0 (emerg) to 7 (debug)")
			}
			if prev, ok := seen[v]; ok {
				return configErr(key, SeverityName(v), ErrSeverity, "already listed as %s", prev)
			}
			seen[v] = key
		}
	}
	if err := s.validateFacilities(); err != nil {
		return err
	}
	if b := s.ProtectBudget.micro; b < 0 || b > microHundred {
		return configErr("severity.protect_budget", s.ProtectBudget.String(), ErrPercentRange, "protect_budget must be from 0%% to 100%% of max")
	}
	return nil
}

// SeverityTable is the severity part of a compiled policy, as the XDP
// program's settings hold it.
type SeverityTable struct {
	// On is false when the policy has no severity block: the program then
	// never reads a <PRI>.
	On bool
	// Class is the class of each severity 0..7.
	Class [8]SeverityClass
	// Facilities has bit f set for each facility f (0..23) whose
	// datagrams are protected whatever their severity (FacilityMask).
	Facilities uint32
	// ProtectBudget is the most packets by which protection may raise a
	// window's passed count: floor(max × protect_budget / 100).
	ProtectBudget uint64
	// ShedDrops[k] is the drop threshold of a shed-first datagram in tier k
	// (0..K): 0 in tier 0, the threshold of tier k+1 in tiers 1..K-1, and
	// AlwaysDrop in the last tier.
	ShedDrops []uint32
}

// compileSeverity fills the severity table of a valid policy whose tier
// drop thresholds are drops (tiers 0..K).
func compileSeverity(p Policy, drops []uint32) SeverityTable {
	if p.Severity == nil {
		return SeverityTable{}
	}
	st := SeverityTable{On: true, ShedDrops: make([]uint32, len(drops))}
	for sev := range st.Class {
		st.Class[sev] = p.Severity.ClassOf(sev)
	}
	st.Facilities = FacilityMask(p.Severity.ProtectFacilities)
	hi, lo := bits.Mul64(p.Max, uint64(p.Severity.ProtectBudget.micro))
	st.ProtectBudget, _ = bits.Div64(hi, lo, microHundred)
	last := len(drops) - 1
	for k := 1; k <= last; k++ {
		if k == last {
			st.ShedDrops[k] = AlwaysDrop
		} else {
			st.ShedDrops[k] = drops[k+1]
		}
	}
	return st
}

// SyslogSeverity reads the <PRI> at the start of a UDP syslog payload as
// SyslogPRI does and returns its severity, PRI mod 8.
func SyslogSeverity(payload []byte) (sev int, ok bool) {
	pri, ok := SyslogPRI(payload)
	return pri & 7, ok
}

// String returns the block on one line, such as "protect emerg,alert within
// 5% of max, shed first debug", and ", protect facilities auth,authpriv"
// when it lists any.
func (s *Severity) String() string {
	if s == nil {
		return "off"
	}
	names := func(l []int) string {
		if len(l) == 0 {
			return "none"
		}
		n := make([]string, len(l))
		for i, v := range l {
			n[i] = SeverityName(v)
		}
		return strings.Join(n, ",")
	}
	out := fmt.Sprintf("protect %s within %s of max, shed first %s", names(s.Protect), s.ProtectBudget, names(s.ShedFirst))
	if len(s.ProtectFacilities) > 0 {
		out += ", protect facilities " + facilityList(s.ProtectFacilities)
	}
	return out
}
