package main

import (
	"bytes"
	"context"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestDemo runs `tierlimit demo` as a function in both shapes: below max
// everything passes, in the second window at 5× max the tiers shed what
// the model says (the first, where the load rises tenfold, the smooth
// shape's estimate is still catching up), the sandbox is gone afterwards,
// and the tenth columns show the shape: the ordinal window's passes arrive
// in a burst at its start (its top tenth holds most of them), the smooth
// one's spread (its top tenth is less than half the ordinal one's).
func TestDemo(t *testing.T) {
	top := map[string]float64{}
	for _, shape := range []string{"ordinal", "smooth"} {
		out, _ := demoCLI(t, "--shape", shape, "--max", "200", "--window", "500ms", "--loads", "0.5,5,5")
		if !strings.Contains(out, "shape="+shape) {
			t.Errorf("%s: the policy line does not name the shape:\n%s", shape, out)
		}
		rows := demoRows(out)
		if len(rows) != 3 {
			t.Fatalf("%s: want 3 window rows:\n%s", shape, out)
		}
		num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
		// Window 1: 100 offered, all passed.
		if rows[0][1] != "100" || rows[0][3] != "100" || rows[0][5] != "0" {
			t.Errorf("%s below max: row %v, want 100 offered, 100 passed, 0 dropped", shape, rows[0])
		}
		// Window 3: 1000 offered; passed within 25% of the model (the row
		// also prints it): the demo's own pacing is the only imprecision.
		passed, expected := num(rows[2][3]), num(rows[2][4])
		if rows[2][1] != "1000" || passed < 0.75*expected || passed > 1.25*expected || num(rows[2][5])+passed != 1000 {
			t.Errorf("%s at 5× max: row %v, want 1000 offered and passed near %v", shape, rows[2], expected)
		}
		// The tenth columns: the top tenth is at least the average and at
		// most the window's passes, and the average is passes / 10.
		for _, r := range rows {
			p, tp, avg := num(r[3]), num(r[6]), num(r[7])
			if avg != p/10 || tp < avg || tp > p {
				t.Errorf("%s: row %v: top tenth %v, average %v of %v passes", shape, r, tp, avg, p)
			}
		}
		top[shape] = num(rows[2][6])
		// Ordinal at 5× max: n < T_1 = 140 pass, sent at 1000 per 0.5 s, so
		// the first tenth (50 ms) receives 100 of the window's ~175.
		if shape == "ordinal" && top[shape] < 0.5*passed {
			t.Errorf("ordinal at 5× max: top tenth %v of %v passes, want the burst: over half", top[shape], passed)
		}
	}
	if top["ordinal"] <= 2*top["smooth"] {
		t.Errorf("top tenth at 5× max: ordinal %v, smooth %v; want ordinal over twice smooth", top["ordinal"], top["smooth"])
	}
}

// TestDemoSteady runs `tierlimit demo` in both shapes at two steady loads,
// three windows each: from the second window at a load on, the collector
// receives the model's P(R) (the expected column) within 5σ, σ that of R
// draws passing with probability P(R)/R (the smooth shape; ordinal's
// passes are exact but for the demo's windows' alignment with the
// program's). The demo offers each window's packets over exactly one
// window, back to back: sent faster, the smooth shape passes more than
// P(R), since it judges by rate.
func TestDemoSteady(t *testing.T) {
	for _, shape := range []string{"smooth", "ordinal"} {
		out, _ := demoCLI(t, "--shape", shape, "--max", "1000", "--window", "500ms", "--loads", "2,2,2,5,5,5")
		rows := demoRows(out)
		if len(rows) != 6 {
			t.Fatalf("%s: want 6 window rows:\n%s", shape, out)
		}
		num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
		for _, i := range []int{1, 2, 4, 5} {
			offered, passed, expected := num(rows[i][1]), num(rows[i][3]), num(rows[i][4])
			q := expected / offered
			sigma := math.Sqrt(offered * q * (1 - q))
			if math.Abs(passed-expected) > 5*sigma {
				t.Errorf("%s: steady window %d: %v offered, %v passed, want P(R) = %v ± %.0f (5σ)", shape, i+1, offered, passed, expected, 5*sigma)
			}
		}
	}
}

// demoRows returns the window rows of demo's output, split in fields.
func demoRows(out string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 8 && f[0] != "window" {
			if _, err := strconv.Atoi(f[0]); err == nil {
				rows = append(rows, f)
			}
		}
	}
	return rows
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
