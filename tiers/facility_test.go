package tiers

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseYAMLProtectFacilities(t *testing.T) {
	src := `
max: 1000
severity:
  shed_first: [info, debug]
  protect_facilities: [auth, authpriv, audit, alert, 16, LOCAL7, security]
`
	_, err := ParseYAML([]byte(src))
	var ce *ConfigError
	// security is auth's alias: listed twice.
	if !errors.As(err, &ce) || !errors.Is(err, ErrFacility) || ce.Key != "severity.protect_facilities[6]" || ce.Line != 5 {
		t.Fatalf("auth twice: %v", err)
	}
	p, err := ParseYAML([]byte(strings.Replace(src, ", security", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	s := p.Severity
	if !slices.Equal(s.ProtectFacilities, []int{4, 10, 13, 14, 16, 23}) {
		t.Fatalf("protect_facilities = %v", s.ProtectFacilities)
	}
	if got, want := s.String(), "protect none within 5% of max, shed first info,debug, protect facilities auth,authpriv,audit,alert,local0,local7"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	c := p.Clone()
	c.Severity.ProtectFacilities[0] = 1
	if s.ProtectFacilities[0] != 4 {
		t.Fatal("Clone shares the facility list")
	}
	tab, err := Compile(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint32(1<<4 | 1<<10 | 1<<13 | 1<<14 | 1<<16 | 1<<23); tab.Severity.Facilities != want {
		t.Fatalf("Facilities = %#x, want %#x", tab.Severity.Facilities, want)
	}
	// A listed facility is protected whatever its severity, shed_first's
	// included; every other facility's datagrams keep their severity's class.
	for pri := -1; pri <= MaxPRI+1; pri++ {
		want := SevNormal
		switch fac, sev := pri>>3, pri&7; {
		case pri < 0 || pri > MaxPRI:
		case slices.Contains(s.ProtectFacilities, fac):
			want = SevProtected
		case sev == 6 || sev == 7:
			want = SevShedFirst
		}
		if got := s.ClassOfPRI(pri); got != want {
			t.Errorf("Severity.ClassOfPRI(%d) = %v, want %v", pri, got, want)
		}
		if got := tab.Severity.ClassOfPRI(pri); got != want {
			t.Errorf("SeverityTable.ClassOfPRI(%d) = %v, want %v", pri, got, want)
		}
	}
}

func TestParseYAMLProtectFacilitiesInvalid(t *testing.T) {
	for _, c := range []struct {
		name, src string
		err       error
		key, val  string
	}{
		{"unknown name", "severity:\n  protect_facilities: [auth, secure]\n", ErrFacility, "severity.protect_facilities[1]", "secure"},
		{"number 24", "severity:\n  protect_facilities: [24]\n", ErrFacility, "severity.protect_facilities[0]", "24"},
		{"negative", "severity:\n  protect_facilities: [-1]\n", ErrFacility, "severity.protect_facilities[0]", "-1"},
		{"leading zero", "severity:\n  protect_facilities: [\"04\"]\n", ErrFacility, "severity.protect_facilities[0]", "04"},
		{"twice", "severity:\n  protect_facilities: [auth, 4]\n", ErrFacility, "severity.protect_facilities[1]", "auth"},
		{"not a list", "severity:\n  protect_facilities: auth\n", ErrType, "severity.protect_facilities", ""},
		{"too many", "severity:\n  protect_facilities: [" + strings.Repeat("0,", 24) + "1]\n", ErrTooMany, "severity.protect_facilities", ""},
	} {
		_, err := ParseYAML([]byte(c.src))
		var ce *ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, c.err) || ce.Key != c.key || ce.Line != 2 || c.val != "" && ce.Value != c.val {
			t.Errorf("%s: error %v (key %q line %d), want %v at %q line 2, value %q", c.name, err, keyOf(ce), lineOf(ce), c.err, c.key, c.val)
		}
	}
	// Validate catches what a Go caller builds.
	p := Default()
	p.Severity = &Severity{ProtectFacilities: []int{3, 40}, ProtectBudget: Pct(5)}
	var ce *ConfigError
	if err := p.Validate(); !errors.As(err, &ce) || !errors.Is(err, ErrFacility) || ce.Key != "severity.protect_facilities[1]" || ce.Value != "40" {
		t.Errorf("Validate: %v", err)
	}
}

func TestSyslogPRI(t *testing.T) {
	for _, c := range []struct {
		in  string
		pri int
		ok  bool
	}{
		{"<0>", 0, true}, {"<38>x", 38, true}, {"<86>", 86, true}, {"<191>", 191, true}, {"<110>", 110, true},
		{"<192>", 0, false}, {"<01>", 0, false}, {"<>", 0, false}, {"<1a>", 0, false},
	} {
		pri, ok := SyslogPRI([]byte(c.in))
		if ok != c.ok || ok && pri != c.pri {
			t.Errorf("SyslogPRI(%q) = %d, %v; want %d, %v", c.in, pri, ok, c.pri, c.ok)
		}
	}
	for f := range NumFacilities {
		if got, err := ParseFacility(FacilityName(f)); err != nil || got != f {
			t.Errorf("ParseFacility(%q) = %d, %v", FacilityName(f), got, err)
		}
	}
}
