package tiers

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrFacility: a facility that is not a syslog facility name or a number
// 0..23, or one listed twice.
var ErrFacility = errors.New("bad facility")

// NumFacilities is the number of syslog facilities, 0..23 (RFC 5424
// §6.2.1 table 1): a <PRI> of at most 191 holds facility × 8 + severity.
const NumFacilities = 24

// facilityNames are the syslog facility keywords, indexed by facility
// (RFC 5424 §6.2.1 table 1, RFC 3164 §4.1.1; the names of syslog.conf and
// logger(1), with "audit" and "alert" for 13 "log audit" and 14 "log
// alert", and "clock" for 15).
var facilityNames = [NumFacilities]string{"kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news",
	"uucp", "cron", "authpriv", "ftp", "ntp", "audit", "alert", "clock",
	"local0", "local1", "local2", "local3", "local4", "local5", "local6", "local7"}

// facilityAliases are the other spellings syslog.conf accepts.
var facilityAliases = map[string]int{"security": 4}

// FacilityName returns the keyword of syslog facility f (0..23): "kern" ..
// "local7".
func FacilityName(f int) string {
	if f < 0 || f >= NumFacilities {
		return "facility(" + strconv.Itoa(f) + ")"
	}
	return facilityNames[f]
}

// ParseFacility parses a syslog facility keyword (kern, user, mail, daemon,
// auth, syslog, lpr, news, uucp, cron, authpriv, ftp, ntp, audit, alert,
// clock, local0..local7, and the alias security for auth) or a number 0..23 (RFC 5424 §6.2.1). Returns an error wrapping
// ErrFacility for anything else.
func ParseFacility(s string) (int, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if i := slices.Index(facilityNames[:], s); i >= 0 {
		return i, nil
	}
	if i, ok := facilityAliases[s]; ok {
		return i, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n < NumFacilities && s == strconv.Itoa(n) {
		return n, nil
	}
	return 0, fmt.Errorf("%w %q: want a name (kern, user, mail, daemon, auth, syslog, lpr, news, uucp, cron, "+
		"authpriv, ftp, ntp, audit, alert, clock, local0-local7) or 0-23", ErrFacility, s)
}

// FacilityMask is the bit mask of facilities fs: bit f for facility f
// (0..23), as SeverityTable.Facilities and the program hold it.
func FacilityMask(fs []int) uint32 {
	var m uint32
	for _, f := range fs {
		if f >= 0 && f < NumFacilities {
			m |= 1 << f
		}
	}
	return m
}

// validateFacilities checks severity.protect_facilities: each 0..23, none
// twice.
func (s *Severity) validateFacilities() error {
	seen := map[int]int{}
	for i, f := range s.ProtectFacilities {
		key := fmt.Sprintf("severity.protect_facilities[%d]", i)
		if f < 0 || f >= NumFacilities {
			return configErr(key, strconv.Itoa(f), ErrFacility, "want a facility from 0 (kern) to 23 (local7)")
		}
		if prev, ok := seen[f]; ok {
			return configErr(key, FacilityName(f), ErrFacility, "already listed as severity.protect_facilities[%d]", prev)
		}
		seen[f] = i
	}
	return nil
}

// ClassOfPRI returns the class of a datagram whose <PRI> is pri (0..191,
// SyslogPRI): SevProtected when its facility (pri / 8) is listed in
// ProtectFacilities, whatever its severity; else ClassOf its severity
// (pri mod 8). Any other pri, such as -1 for no valid <PRI>, is SevNormal.
func (s *Severity) ClassOfPRI(pri int) SeverityClass {
	if s == nil || pri < 0 || pri > MaxPRI {
		return SevNormal
	}
	if slices.Contains(s.ProtectFacilities, pri>>3) {
		return SevProtected
	}
	return s.ClassOf(pri & 7)
}

// ClassOfPRI returns the class of a datagram whose <PRI> is pri, as the
// program reads the table (bpf/severity.h pri_class): protected when its
// facility's bit is set in Facilities, else Class of its severity;
// SevNormal for a pri outside 0..191 or a table that is off.
func (t SeverityTable) ClassOfPRI(pri int) SeverityClass {
	if !t.On || pri < 0 || pri > MaxPRI {
		return SevNormal
	}
	if t.Facilities>>(pri>>3)&1 != 0 {
		return SevProtected
	}
	return t.Class[pri&7]
}

// MaxPRI is the largest valid <PRI>: facility 23, severity 7 (RFC 5424
// §6.2.1).
const MaxPRI = 191

// SyslogPRI reads the <PRI> at the start of a UDP syslog payload (RFC 5424
// §6.2.1, RFC 3164 §4.1.1: "<", 1 to 3 digits without a leading zero, a
// value 0..191, ">") and returns it: facility pri / 8, severity pri mod 8.
// ok is false for a missing, malformed or out-of-range PRI, which the
// program treats as class normal. It reads at most the first 5 bytes, as
// the program does (bpf/severity.h parse_pri).
func SyslogPRI(payload []byte) (pri int, ok bool) {
	if len(payload) < 3 || payload[0] != '<' {
		return 0, false
	}
	v := 0
	for i := 1; i <= 4; i++ {
		if i >= len(payload) {
			return 0, false
		}
		c := payload[i]
		switch {
		case c == '>':
			if i == 1 || v > MaxPRI {
				return 0, false
			}
			return v, true
		case i == 4, c < '0' || c > '9', i == 2 && payload[1] == '0':
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return 0, false
}

// facilityList names facilities fs for String: "auth,authpriv".
func facilityList(fs []int) string {
	n := make([]string, len(fs))
	for i, f := range fs {
		n[i] = FacilityName(f)
	}
	return strings.Join(n, ",")
}
