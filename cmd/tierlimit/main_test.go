package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/tiers"
)

// runCmd runs the command line and returns its exit code, stdout and stderr
// as main would produce them.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), args, &out, &errb)
	code = report(&errb, err)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCheckDefault(t *testing.T) {
	code, out, errs := runCmd(t, "check")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{
		"embedded default: valid", "enforce", "1s", "40000",
		"[1, 28000)", "[28000, 32000)", "[32000, 40000)", "[40000, ∞)",
		"40001 entries", "rounding: exact",
		"0.5 × max", "10 × max", "35199.0", "udp", "601,6514", "syn", "exempt sources: none",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("\n%s", out)
}

func TestCheckRounding(t *testing.T) {
	for _, c := range []struct {
		max  string
		want []string
	}{
		// 10^8 / 2^7 = 781250 entries fit in 2^20, and 70, 80 and 100% of
		// 10^8 are multiples of 128.
		{"100000000", []string{"781251 entries", "step 128 packets (n >> 7)", "rounding: exact, every threshold", "TABLE FROM"}},
		// T_3 = 100000001 moves to the next multiple of 128.
		{"100000001", []string{"781252 entries", "step 128 packets (n >> 7)", "at most 127 packets", "TABLE FROM", "[100000001, ∞)", "100000128"}},
	} {
		path := writeFile(t, "big.yaml", "max: "+c.max+"\n")
		code, out, errs := runCmd(t, "check", "--config", path)
		if code != 0 {
			t.Fatalf("max %s: exit %d, stderr %q", c.max, code, errs)
		}
		for _, want := range c.want {
			if !strings.Contains(out, want) {
				t.Errorf("max %s: check output lacks %q:\n%s", c.max, want, out)
			}
		}
	}
}

func TestCheckProperties(t *testing.T) {
	path := writeFile(t, "limiter.properties", "limiter.switch=false\nlimiter.max=1000\n")
	code, out, errs := runCmd(t, "--log-format", "json", "check", "--config", path)
	if code != 0 || !strings.Contains(out, "mode    off") || !strings.Contains(out, "[700, 800)") {
		t.Fatalf("exit %d, stderr %q, output:\n%s", code, errs, out)
	}
}

func TestCheckWarnsEmptyTiers(t *testing.T) {
	path := writeFile(t, "small.yaml", "max: 3\ntiers: [{at: 50, drop: 10}, {at: 60, drop: 20}, {at: 100, drop: 100}]\n")
	code, out, errs := runCmd(t, "--log-format", "json", "check", "--config", path)
	if code != 0 || !strings.Contains(out, "[1, 1) empty") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
	if !strings.Contains(errs, `"level":"WARN"`) || !strings.Contains(errs, `"tier":1`) || strings.Count(errs, "\n") != 2 {
		t.Errorf("stderr %q, want two JSON warnings, one naming tier 1", errs)
	}
}

func TestCheckBadConfig(t *testing.T) {
	path := writeFile(t, "bad.yaml", "max: 40000\ntiers:\n  - {at: 70%, drop: 20%}\n  - {at: 60%, drop: 50%}\n")
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"check", "--config", path}, &out, &errb)
	var ce *tiers.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, tiers.ErrTierOrder) {
		t.Fatalf("error %v, want a tiers.ConfigError", err)
	}
	code := report(&errb, err)
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	msg := errb.String()
	if strings.Count(msg, "\n") != 1 {
		t.Errorf("stderr is not one line: %q", msg)
	}
	for _, want := range []string{path, "line 4", "tiers[1].at", `"60%"`, "out of order"} {
		if !strings.Contains(msg, want) {
			t.Errorf("stderr %q lacks %q", msg, want)
		}
	}
	if out.Len() != 0 {
		t.Errorf("stdout %q, want nothing", out.String())
	}
}

func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"version"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"check", "--config", "/nonexistent/policy.yaml"}, 2},
		{[]string{"check", "extra"}, 2},
		{[]string{"check", "--bogus"}, 2},
		{[]string{"bogus"}, 2},
		{[]string{"--log-format", "xml", "check"}, 2},
		{[]string{"demo", "--shape", "square"}, 2},
	} {
		code, _, errs := runCmd(t, c.args...)
		if code != c.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", c.args, code, c.code, errs)
		}
	}
	if got := exitCode(errors.New("attach failed")); got != 1 {
		t.Errorf("exitCode(runtime error) = %d, want 1", got)
	}
	if got := exitCode(configError{errors.New("x")}); got != 2 {
		t.Errorf("exitCode(configError) = %d, want 2", got)
	}
}

func TestVersion(t *testing.T) {
	old := bpfObjectHash
	defer func() { bpfObjectHash = old }()
	bpfObjectHash = func() string { return "sha256:feed" }
	code, out, _ := runCmd(t, "version")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"version", "commit", "go1.", "sha256:feed"} {
		if !strings.Contains(out, want) {
			t.Errorf("version output lacks %q:\n%s", want, out)
		}
	}
}

// TestRunDuplicateIface (issue 11 D): the same --iface twice is a usage
// error, found before anything is loaded.
func TestRunDuplicateIface(t *testing.T) {
	code, _, errs := runCmd(t, "run", "--iface", "tl-absent0", "--iface", "tl-absent0", "--metrics-addr", "")
	if code != exitUsage || !strings.Contains(errs, "--iface tl-absent0 given twice") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// TestDetachUsage: detach needs --iface or --all, not both (exit 2, before
// anything is touched).
func TestDetachUsage(t *testing.T) {
	for _, args := range [][]string{{"detach"}, {"detach", "--all", "--iface", "eth0"}, {"detach", "--everything"}} {
		code, _, errs := runCmd(t, args...)
		if code != 2 || !strings.Contains(errs, "--all") {
			t.Errorf("%v: exit %d, stderr %q; want 2, naming --all", args, code, errs)
		}
	}
}
