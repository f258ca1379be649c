package main

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestDemo runs `tierlimit demo` as a function: below max everything
// passes, at 3× max the tiers shed what the model says, and the sandbox is
// gone afterwards.
func TestDemo(t *testing.T) {
	out, _ := demoCLI(t, "--max", "200", "--window", "200ms", "--loads", "0.5,3")
	var rows [][]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[0] != "window" {
			if _, err := strconv.Atoi(f[0]); err == nil {
				rows = append(rows, f)
			}
		}
	}
	if len(rows) != 2 {
		t.Fatalf("want 2 window rows:\n%s", out)
	}
	num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
	// Window 1: 100 offered, all passed.
	if rows[0][1] != "100" || rows[0][3] != "100" || rows[0][5] != "0" {
		t.Errorf("below max: row %v, want 100 offered, 100 passed, 0 dropped", rows[0])
	}
	// Window 2: 600 offered; passed within 25% of the model (the row also
	// prints it): the demo's own pacing is the only imprecision.
	passed, expected := num(rows[1][3]), num(rows[1][4])
	if rows[1][1] != "600" || passed < 0.75*expected || passed > 1.25*expected || num(rows[1][5])+passed != 600 {
		t.Errorf("at 3× max: row %v, want 600 offered and passed near %v", rows[1], expected)
	}
}

// TestDemoSeverity runs `tierlimit demo --severity`: at 5× max every crit
// datagram passes while most debug is shed. (Debug against info is
// TestSeverityFlood's, in agent: at this small max the pacing, not the
// policy, decides it.)
func TestDemoSeverity(t *testing.T) {
	out, _ := demoCLI(t, "--severity", "--max", "400", "--window", "500ms", "--loads", "5")
	var row []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 9 && f[0] == "1" {
			row = f
		}
	}
	if row == nil {
		t.Fatalf("no window row:\n%s", out)
	}
	frac := func(s string) (int, int) {
		a, b, _ := strings.Cut(s, "/")
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x, y
	}
	critP, critS := frac(row[5])
	infoP, infoS := frac(row[6])
	debugP, debugS := frac(row[7])
	t.Logf("crit %d/%d, info %d/%d, debug %d/%d", critP, critS, infoP, infoS, debugP, debugS)
	if critS != 20 || critP != critS {
		t.Errorf("crit passed %d of %d, want all 20", critP, critS)
	}
	if debugS != 1000 || infoS != 980 || debugP*2 >= debugS {
		t.Errorf("debug passed %d of %d (info %d), want under half", debugP, debugS, infoS)
	}
}

// demoCLI runs `tierlimit demo` with args as a function, logs its output,
// and returns its stdout and stderr. It fails t when the demo fails, and
// after it when the demo left its sandbox namespace behind.
func demoCLI(t *testing.T, args ...string) (out, errs string) {
	t.Helper()
	testenv.Require(t)
	var o, e bytes.Buffer
	if err := run(context.Background(), append([]string{"demo"}, args...), &o, &e); err != nil {
		t.Fatalf("demo %s: %v\n%s", strings.Join(args, " "), err, e.String())
	}
	t.Logf("\n%s", o.String())
	if list, _ := exec.Command("ip", "netns", "list").Output(); bytes.Contains(list, []byte("tldemo")) {
		t.Errorf("demo left its sandbox behind: %s", list)
	}
	return o.String(), e.String()
}
