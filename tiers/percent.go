package tiers

import (
	"fmt"
	"strconv"
	"strings"
)

// Percents are held exactly as integers of micro-percent (1% = 1e6), so that
// T_k = floor(max × at / 100) and the drop thresholds are computed without
// floating-point error: 40000 × 70% is 28000, never 27999.
const (
	microPerPercent = 1_000_000
	microHundred    = 100 * microPerPercent
	// percentDecimals is the most decimal places a percent may have.
	percentDecimals = 6
	// maxMicro bounds what parseMicro accepts, far above any valid percent,
	// so that nothing overflows before the range checks run.
	maxMicro = 1 << 52
)

// parseMicro parses a plain decimal ("70", "12.5", "-3", "+.5") into
// micro-percent. ok is false for anything else (exponents, underscores, hex,
// NaN), for more than six decimal places and for magnitudes over maxMicro;
// fine is true when only the decimal places were at fault.
func parseMicro(s string) (micro int64, ok, fine bool) {
	neg := false
	switch {
	case strings.HasPrefix(s, "-"):
		neg, s = true, s[1:]
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	}
	intPart, frac, _ := strings.Cut(s, ".")
	if intPart == "" && frac == "" {
		return 0, false, false
	}
	for _, r := range intPart + frac {
		if r < '0' || r > '9' {
			return 0, false, false
		}
	}
	frac = strings.TrimRight(frac, "0")
	if len(frac) > percentDecimals {
		return 0, false, true
	}
	intPart = strings.TrimLeft(intPart, "0")
	if len(intPart) > 12 {
		return 0, false, false
	}
	var v int64
	for _, r := range intPart {
		v = v*10 + int64(r-'0')
	}
	v *= microPerPercent
	scale := int64(microPerPercent)
	for _, r := range frac {
		scale /= 10
		v += int64(r-'0') * scale
	}
	if v > maxMicro {
		return 0, false, false
	}
	if neg {
		v = -v
	}
	return v, true, false
}

// Percent is an exact percent, held as an integer count of micro-percent
// (1% = 10^6) from parse onward, so that T_k = floor(max × at / 100) and the
// drop thresholds are computed without floating-point error. It is a struct
// so that an untyped number cannot be mistaken for one: write Pct(70),
// PercentFromMicro(12_500_000) or ParsePercent("12.5%"). The zero value is 0%.
type Percent struct{ micro int64 }

// Pct returns whole percent p: Pct(70) is 70%.
func Pct(p int64) Percent { return Percent{p * microPerPercent} }

// PercentFromMicro returns m micro-percent: PercentFromMicro(12_500_000) is 12.5%.
func PercentFromMicro(m int64) Percent { return Percent{m} }

// Micro returns the percent in micro-percent (70% is 70_000_000).
func (p Percent) Micro() int64 { return p.micro }

// Ratio returns the percent as a ratio, 0..1 for 0%..100%: 70% is 0.7. It is
// for display and statistics only; thresholds never go through it.
func (p Percent) Ratio() float64 { return float64(p.micro) / microHundred }

// String returns the percent as a minimal decimal with its sign: "70%", "12.5%".
func (p Percent) String() string { return formatMicro(p.micro) + "%" }

// ParsePercent parses "70", "12.5" or "12.5%" exactly (see parseMicro).
// Returns ErrType for text that is not a plain decimal and ErrPercentRange
// for more than six decimal places; ranges are Validate's job.
func ParsePercent(s string) (Percent, error) {
	m, ok, fine := parseMicro(strings.TrimSuffix(strings.TrimSpace(s), "%"))
	if !ok {
		if fine {
			return Percent{}, fmt.Errorf("%w: at most %d decimal places", ErrPercentRange, percentDecimals)
		}
		return Percent{}, fmt.Errorf("%w: want a percent such as 70, 70%% or 12.5%%", ErrType)
	}
	return Percent{m}, nil
}

// formatMicro prints micro-percent as a minimal decimal, without the sign %.
func formatMicro(m int64) string {
	neg := m < 0
	if neg {
		m = -m
	}
	s := strconv.FormatInt(m/microPerPercent, 10)
	if frac := m % microPerPercent; frac != 0 {
		fs := strconv.FormatInt(frac+microPerPercent, 10)[1:]
		s += "." + strings.TrimRight(fs, "0")
	}
	if neg {
		s = "-" + s
	}
	return s
}

// MustParsePercent is ParsePercent for literals known to be valid, such as
// defaults and tests; it panics on an error.
func MustParsePercent(s string) Percent {
	p, err := ParsePercent(s)
	if err != nil {
		panic(fmt.Sprintf("tiers: MustParsePercent(%q): %v", s, err))
	}
	return p
}
