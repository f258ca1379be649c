package tiers

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		unit bool
	}{
		{"1500", 1500, false},
		{"1B", 1, true},
		{"64KiB", 64 << 10, true},
		{"64 KiB", 64 << 10, true},
		{"1.5MiB", 3 << 19, true},
		{"500GB", 500e9, true},
		{"2kB", 2000, true},
		{"2KB", 2000, true},
		{"1.5 MB", 1500000, true},
		{"3MB", 3e6, true},
		{"1GiB", 1 << 30, true},
		{"2TB", 2e12, true},
		{"1TiB", 1 << 40, true},
		{"0.001KB", 1, true},
		{"18446744073709551615", math.MaxUint64, false},
	} {
		got, unit, err := ParseSize(c.in)
		if err != nil || got != c.want || unit != c.unit {
			t.Errorf("ParseSize(%q) = %d, %v, %v; want %d, %v", c.in, got, unit, err, c.want, c.unit)
		}
	}
	for _, c := range []struct {
		in   string
		want error
	}{
		{"", ErrType}, {"MB", ErrType}, {"-5MB", ErrType}, {"5mb", ErrType}, {"5Mb", ErrType},
		{"1.5B", ErrType}, {"1.5", ErrType}, {"1.KB", ErrType}, {".5KB", ErrType}, {"5 M", ErrType},
		{"0", ErrSize}, {"0MB", ErrSize}, {"18446744073709551616", ErrSize}, {"20000000TB", ErrSize},
		{"1e3", ErrType}, {"0x10KB", ErrType}, {"1.0000000000001KB", ErrType},
	} {
		if n, _, err := ParseSize(c.in); !errors.Is(err, c.want) {
			t.Errorf("ParseSize(%q) = %d, %v; want %v", c.in, n, err, c.want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1: "1 B", 1500: "1500 B", 2000: "2 KB", 1 << 20: "1 MiB", 500e9: "500 GB", 3 << 19: "1536 KiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestCountBytesYAML: count: bytes takes byte units wherever a count is
// written (max, the auto bounds, fleet.max, a source budget), a bare
// number is bytes, and at stays a percent of max.
func TestCountBytesYAML(t *testing.T) {
	p, err := ParseYAML([]byte(`
count: bytes
max: 10MB
tiers: [{at: 50%, drop: 10%}, {at: 100%, drop: 100%}]
select: [{proto: udp, ports: [514]}]
sources: {budget: 64KiB}
`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Count != CountBytes || p.Max != 10e6 || p.Sources.BudgetPackets != 64<<10 {
		t.Fatalf("got count %v max %d budget %d", p.Count, p.Max, p.Sources.BudgetPackets)
	}
	if th := p.Thresholds(); th[0] != 5e6 || th[1] != 10e6 {
		t.Errorf("thresholds %v, want [5000000 10000000]", th)
	}
	if !strings.Contains(p.String(), "count=bytes") {
		t.Errorf("String() = %q", p.String())
	}
	tbl, err := Compile(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !tbl.Settings.Bytes || tbl.Settings.Max != 10e6 {
		t.Errorf("settings %+v", tbl.Settings)
	}
	// 10^7 bytes: a table of 2^20 entries at step 2^4, boundaries up to
	// 15 bytes late.
	if tbl.Shift != 4 || tbl.MaxRoundingError > 15 {
		t.Errorf("shift %d rounding %d", tbl.Shift, tbl.MaxRoundingError)
	}
	p, err = ParseYAML([]byte("count: bytes\nmax: auto\nselect: [{proto: udp, ports: [514]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Auto.Start != DefaultAutoStartBytes || p.Max != DefaultAutoStartBytes {
		t.Errorf("auto %+v max %d", p.Auto, p.Max)
	}
	p, err = ParseYAML([]byte("count: bytes\nmax: auto\nauto: {start: 1GB, floor: 100MiB}\nselect: [{proto: udp, ports: [514]}]\n"))
	if err != nil || p.Auto.Start != 1e9 || p.Auto.Floor != 100<<20 || p.Auto.Ceiling != 5e9 {
		t.Errorf("auto %+v, %v", p.Auto, err)
	}
	// The default counts packets, and says so nowhere in String.
	if p, err := ParseYAML([]byte("max: 100\n")); err != nil || p.Count != CountPackets || strings.Contains(p.String(), "count") {
		t.Errorf("default count %v, %v", p.Count, err)
	}
}

// TestCountBytesBadInput: each error names the key and the value as
// written.
func TestCountBytesBadInput(t *testing.T) {
	for _, c := range []struct {
		src, want string
		err       error
	}{
		{"max: 10MB\n", `line 1: max: "10MB": byte unit on a packet policy: a byte unit needs count: bytes (this policy counts packets)`, ErrUnit},
		{"count: packets\nmax: 100\nsources: {budget: 4KB}\n", `line 3: sources.budget: "4KB": byte unit on a packet policy`, ErrUnit},
		{"max: auto\nauto: {start: 1MB}\n", `line 2: auto.start: "1MB": byte unit on a packet policy`, ErrUnit},
		{"count: bogus\n", `line 1: count: "bogus": bad count: want packets or bytes`, ErrCount},
		{"count: syn\n", `line 1: count: "syn": bad count: want packets or bytes`, ErrCount},
		{"count: bytes\nmax: 0MB\n", `line 2: max: "0MB": max out of range: must be from 1 to 1099511627776 bytes`, ErrMax},
		{"count: bytes\nmax: -5\n", `line 2: max: "-5": max out of range: must be from 1 to 1099511627776 bytes`, ErrMax},
		{"count: bytes\nmax: 2TB\n", `line 2: max: "2TB": max out of range: must be from 1 to 1099511627776 bytes`, ErrMax},
		{"count: bytes\nmax: 5mb\n", `line 2: max: "5mb": wrong type: want a whole number of packets (or a size such as 500MB under count: bytes), or auto, got text`, ErrType},
		{"count: bytes\nmax: 1.5B\n", `line 2: max: "1.5B": wrong type`, ErrType},
		{"count: bytes\nmax: 1MB\nsources: {budget: 0KB}\n", `line 3: sources.budget: "0KB": bad budget`, ErrBudget},
		{"count: bytes\nmax: 1MB\nsources: {budget: 2MB}\n", `line 3: sources.budget: "2MB": bad budget: must be from 1 to max (1000000) bytes`, ErrBudget},
		{"count: bytes\nmax: 1MB\nsources: {budget: 0.00001%}\n", `line 3: sources.budget: "0.00001%": bad budget: 0.00001% of max 1000000 is less than one byte`, ErrBudget},
	} {
		_, err := ParseYAML([]byte(c.src))
		if !errors.Is(err, c.err) || err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("ParseYAML(%q) = %v\nwant prefix %s (%v)", c.src, err, c.want, c.err)
		}
	}
	// A Go-built policy with an undefined count.
	p := Default()
	p.Count = CountSYN
	if err := p.Validate(); !errors.Is(err, ErrCount) || !strings.Contains(err.Error(), `count: "syn"`) {
		t.Errorf("Validate = %v", err)
	}
}
