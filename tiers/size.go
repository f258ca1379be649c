package tiers

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// Byte units of a size (docs/design.md §3): the SI ones are powers of 1000,
// the IEC ones (KiB...) powers of 1024 (IEC 80000-13). A size without a unit
// is a plain number: bytes under count: bytes, packets otherwise.
var sizeUnits = []struct {
	name string
	mult uint64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"B", 1},
}

// errSizeSyntax is what ParseSize wraps (with ErrType) for text that is not
// a size; the caller names the key.
var errSizeSyntax = errors.New("want a whole number of bytes, or a number and a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), such as 500GB or 1.5MiB")

// ParseSize parses a size: digits with an optional decimal fraction, then
// optionally spaces and a unit (B, KB or kB, MB, GB, TB; KiB, MiB, GiB,
// TiB), such as "1500", "64KiB", "500GB" or "1.5 MB". It returns the
// number in bytes (or the plain number when no unit is written) and whether
// a unit was written. The result must be a whole number: "1.5KB" is 1500,
// "1.5B" is an error.
//
// Returns an error wrapping ErrType for text that is not a size, a
// fraction without a unit or a fraction of a byte, and ErrSize for a size
// that is 0 (n 0) or beyond 2^64 - 1 (n math.MaxUint64). The license (`per_day`) and the policy's
// byte counts (max, fleet.max, the auto bounds, a source budget) share it.
func ParseSize(s string) (n uint64, unit bool, err error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(t, u.name); ok {
			t, mult, unit = strings.TrimRight(rest, " "), u.mult, true
			break
		}
	}
	whole, frac, hasFrac := strings.Cut(t, ".")
	if whole == "" || !digits(whole) || hasFrac && (frac == "" || !digits(frac) || !unit) {
		return 0, unit, fmt.Errorf("%w: %w", ErrType, errSizeSyntax)
	}
	n, ok := scaled(whole, mult)
	if !ok {
		return math.MaxUint64, unit, fmt.Errorf("%w: more than 2^64 - 1 bytes", ErrSize)
	}
	if hasFrac {
		// frac × mult / 10^len(frac) must be whole; mult <= 2^40 and at
		// most 12 digits keep the product below 2^64 (checked).
		f, ok := scaled(frac, mult)
		den := uint64(1)
		for range frac {
			den *= 10
		}
		if !ok || len(frac) > 12 || f%den != 0 {
			return 0, unit, fmt.Errorf("%w: a size must be a whole number of bytes", ErrType)
		}
		var carry uint64
		if n, carry = bits.Add64(n, f/den, 0); carry != 0 {
			return math.MaxUint64, unit, fmt.Errorf("%w: more than 2^64 - 1 bytes", ErrSize)
		}
	}
	if n == 0 {
		return 0, unit, fmt.Errorf("%w: a size must be more than 0", ErrSize)
	}
	return n, unit, nil
}

func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// scaled is the decimal number ds times mult, and false on overflow.
func scaled(ds string, mult uint64) (uint64, bool) {
	var v uint64
	for _, c := range ds {
		hi, lo := bits.Mul64(v, 10)
		if hi != 0 {
			return 0, false
		}
		var carry uint64
		if v, carry = bits.Add64(lo, uint64(c-'0'), 0); carry != 0 {
			return 0, false
		}
	}
	hi, lo := bits.Mul64(v, mult)
	return lo, hi == 0
}

// FormatSize writes n bytes for people: "1500 B", "64 KiB" when n is a
// whole number of KiB, MiB, GiB or TiB, "500 GB" when a whole number of
// KB..TB, else the bytes.
func FormatSize(n uint64) string {
	if n == 0 {
		return "0 B"
	}
	for _, u := range []struct {
		name string
		mult uint64
	}{{"TiB", 1 << 40}, {"TB", 1e12}, {"GiB", 1 << 30}, {"GB", 1e9}, {"MiB", 1 << 20}, {"MB", 1e6}, {"KiB", 1 << 10}, {"KB", 1e3}} {
		if n%u.mult == 0 {
			return fmt.Sprintf("%d %s", n/u.mult, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
