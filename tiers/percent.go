package tiers

import (
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

// floatMicro converts a percent held as float64 to micro-percent, exactly:
// it reads back the shortest decimal that round-trips to f, which is the
// decimal the config wrote. ok is false for NaN, infinities, magnitudes over
// maxMicro and more than six decimal places.
func floatMicro(f float64) (micro int64, ok bool) {
	if f != f || f > 1e9 || f < -1e9 {
		return 0, false
	}
	m, ok, _ := parseMicro(strconv.FormatFloat(f, 'f', -1, 64))
	return m, ok
}

// microFloat is the float64 nearest to a micro-percent value. For the
// values parseMicro accepts it round-trips through floatMicro.
func microFloat(m int64) float64 {
	f, _ := strconv.ParseFloat(formatMicro(m), 64)
	return f
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

// formatPercent prints a percent for messages and summaries: "70%", "12.5%".
func formatPercent(f float64) string {
	return strconv.FormatFloat(f, 'f', -1, 64) + "%"
}
