package tiers

import (
	"errors"
	"slices"
	"testing"
)

func TestParseYAMLSeverity(t *testing.T) {
	src := `
severity:
  protect: [emerg, alert, crit, 3]
  protect_budget: 2.5%
  shed_first: [debug, warn]
`
	p, err := ParseYAML([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	s := p.Severity
	if s == nil || !slices.Equal(s.Protect, []int{0, 1, 2, 3}) || !slices.Equal(s.ShedFirst, []int{7, 4}) ||
		s.ProtectBudget != MustParsePercent("2.5") {
		t.Fatalf("severity = %+v", s)
	}
	if got, want := s.String(), "protect emerg,alert,crit,err within 2.5% of max, shed first debug,warning"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	// protect_budget defaults to 5%; severity: null is off.
	p, err = ParseYAML([]byte("severity: {protect: [crit]}\n"))
	if err != nil || p.Severity.ProtectBudget != Pct(5) {
		t.Fatalf("default budget: %+v, %v", p.Severity, err)
	}
	if p, err = ParseYAML([]byte("severity:\nmax: 10\n")); err != nil || p.Severity != nil {
		t.Fatalf("severity: null: %+v, %v", p.Severity, err)
	}
	// Default has none, and Clone copies the lists.
	if Default().Severity != nil {
		t.Fatal("the default policy has a severity block")
	}
	p = Policy{Severity: &Severity{Protect: []int{1}}}
	c := p.Clone()
	c.Severity.Protect[0] = 2
	if p.Severity.Protect[0] != 1 {
		t.Fatal("Clone shares the protect list")
	}
}

func TestParseYAMLSeverityInvalid(t *testing.T) {
	for _, c := range []struct {
		name, src string
		err       error
		key       string
		line      int
	}{
		{"unknown name", "severity:\n  protect: [critical]\n", ErrSeverity, "severity.protect[0]", 2},
		{"number 8", "severity:\n  protect: [8]\n", ErrSeverity, "severity.protect[0]", 2},
		{"negative", "severity:\n  shed_first: [-1]\n", ErrSeverity, "severity.shed_first[0]", 2},
		{"leading zero", "severity:\n  shed_first: [\"07\"]\n", ErrSeverity, "severity.shed_first[0]", 2},
		{"twice", "severity:\n  protect: [crit, 2]\n", ErrSeverity, "severity.protect[1]", 2},
		{"both lists", "severity:\n  protect: [crit]\n  shed_first:\n    - debug\n    - crit\n", ErrSeverity, "severity.shed_first[1]", 5},
		{"budget over 100", "severity:\n  protect_budget: 101%\n", ErrPercentRange, "severity.protect_budget", 2},
		{"budget negative", "severity:\n  protect_budget: -1\n", ErrPercentRange, "severity.protect_budget", 2},
		{"budget text", "severity:\n  protect_budget: some\n", ErrType, "severity.protect_budget", 2},
		{"unknown key", "severity:\n  protected: [crit]\n", ErrUnknownKey, "severity.protected", 2},
		{"not a list", "severity:\n  protect: crit\n", ErrType, "severity.protect", 2},
		{"not a mapping", "severity: [crit]\n", ErrType, "severity", 1},
		{"too many", "severity:\n  protect: [0,1,2,3,4,5,6,7,0]\n", ErrTooMany, "severity.protect", 2},
	} {
		_, err := ParseYAML([]byte(c.src))
		var ce *ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, c.err) || ce.Key != c.key || ce.Line != c.line {
			t.Errorf("%s: error %v (key %q line %d), want %v at %q line %d", c.name, err, keyOf(ce), lineOf(ce), c.err, c.key, c.line)
		}
	}
}

func keyOf(ce *ConfigError) string {
	if ce == nil {
		return ""
	}
	return ce.Key
}

func lineOf(ce *ConfigError) int {
	if ce == nil {
		return 0
	}
	return ce.Line
}

func TestSyslogSeverity(t *testing.T) {
	for _, c := range []struct {
		in  string
		sev int
		ok  bool
	}{
		{"<0>", 0, true}, {"<7>", 7, true}, {"<10>x", 2, true}, {"<15>", 7, true}, {"<191>", 7, true},
		{"<184>", 0, true}, {"<99>", 3, true},
		{"<192>", 0, false}, {"<>", 0, false}, {"<1a>", 0, false}, {"<01>", 0, false}, {"<00>", 0, false},
		{"<1", 0, false}, {"<", 0, false}, {"", 0, false}, {"1>", 0, false}, {"<1234>", 0, false}, {" <1>", 0, false},
	} {
		sev, ok := SyslogSeverity([]byte(c.in))
		if ok != c.ok || ok && sev != c.sev {
			t.Errorf("SyslogSeverity(%q) = %d, %v; want %d, %v", c.in, sev, ok, c.sev, c.ok)
		}
	}
	for _, s := range []string{"emerg", "panic", "ALERT", "crit", "err", "error", "warning", "warn", "notice", "info", "debug"} {
		if _, err := ParseSeverity(s); err != nil {
			t.Errorf("ParseSeverity(%q): %v", s, err)
		}
	}
}

// compileSeverity: shed-first takes the next tier's threshold, always drops
// in the last tier and never in tier 0; the budget is floor(max × pct).
func TestCompileSeverity(t *testing.T) {
	p := Default()
	p.Max = 999
	p.Severity = &Severity{Protect: []int{2}, ProtectBudget: Pct(5), ShedFirst: []int{7}}
	tab, err := Compile(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := tab.Severity
	want := []uint32{0, tab.Drops[2], tab.Drops[3], AlwaysDrop}
	if !st.On || st.ProtectBudget != 49 || !slices.Equal(st.ShedDrops, want) {
		t.Fatalf("severity table %+v; want budget 49, shed drops %v", st, want)
	}
	if st.Class[2] != SevProtected || st.Class[7] != SevShedFirst || st.Class[6] != SevNormal {
		t.Errorf("classes %v", st.Class)
	}
	if tab, _ := Compile(Default(), 0); tab.Severity.On {
		t.Error("severity on without a block")
	}
}
