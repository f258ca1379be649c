package tierlimit_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// rank orders the module's layers: a package may import its own layer or a
// lower one, never a higher one (tiers ← bpf ← agent ← cmd). internal/ holds
// helpers shared by the tests of several layers and by cmd; tiers and bpf may
// use it only from their tests.
var rank = []struct {
	prefix string
	rank   int
}{
	{"tiers", 0},
	{"bpf", 1},
	{"internal", 2},
	{"agent", 3},
	{"cmd", 4},
}

func layerOf(module, pkg string) (string, int, bool) {
	rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
	if rel == pkg || rel == "" {
		return "", 0, false
	}
	for _, r := range rank {
		if rel == r.prefix || strings.HasPrefix(rel, r.prefix+"/") {
			return r.prefix, r.rank, true
		}
	}
	return rel, -1, true
}

// TestLayersPointDown fails when a package of the module depends, directly
// or not, on a package of a higher layer, or sits outside every layer.
func TestLayersPointDown(t *testing.T) {
	module := strings.TrimSpace(goCmd(t, "list", "-m"))
	seen := 0
	for _, p := range goList(t, "./...") {
		layer, r, ok := layerOf(module, p.ImportPath)
		if !ok {
			continue // the root package: gen.go only
		}
		seen++
		if r < 0 {
			t.Errorf("%s is in no layer (tiers, bpf, internal, agent, cmd)", p.ImportPath)
			continue
		}
		for _, d := range p.Deps {
			dl, dr, ok := layerOf(module, d)
			if ok && dr > r {
				t.Errorf("%s (layer %s) depends on %s (layer %s, higher)", p.ImportPath, layer, d, dl)
			}
		}
		// Tests may also use the shared helpers in internal/, whose own
		// dependencies the loop above checks.
		for _, d := range append(p.TestImports, p.XTestImports...) {
			dl, dr, ok := layerOf(module, d)
			if ok && dr > r && dl != "internal" {
				t.Errorf("tests of %s (layer %s) import %s (layer %s, higher)", p.ImportPath, layer, d, dl)
			}
		}
	}
	if seen < 5 {
		t.Fatalf("go list found %d packages of %s; want the whole module", seen, module)
	}
}

// TestRoomsDoNotImportAgent fails when a package under agent/ (a room:
// agent/pin, agent/automax, agent/record, agent/fleet, agent/attach) depends, directly or
// not, on the agent package itself, or its tests import it: the agent is
// the door that wires the rooms through narrow interfaces, and a room never
// knows the *Agent.
func TestRoomsDoNotImportAgent(t *testing.T) {
	module := strings.TrimSpace(goCmd(t, "list", "-m"))
	door := module + "/agent"
	rooms := map[string]bool{}
	for _, p := range goList(t, "./agent/...") {
		if !strings.HasPrefix(p.ImportPath, door+"/") {
			continue
		}
		rooms[strings.TrimPrefix(p.ImportPath, module+"/")] = true
		for _, d := range append(append(p.Deps, p.TestImports...), p.XTestImports...) {
			if d == door {
				t.Errorf("%s depends on %s: a room of the agent imports the door", p.ImportPath, d)
			}
		}
	}
	for _, want := range []string{"agent/pin", "agent/automax", "agent/record", "agent/fleet", "agent/attach"} {
		if !rooms[want] {
			t.Errorf("go list found no %s among the rooms %v", want, rooms)
		}
	}
}

// listed is what goList reads of a package.
type listed struct {
	ImportPath   string
	Deps         []string
	TestImports  []string
	XTestImports []string
}

// goList lists the packages of pattern with their dependencies and their
// tests' imports (go list -json).
func goList(t *testing.T, pattern string) []listed {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(goCmd(t, "list", "-json=ImportPath,Deps,TestImports,XTestImports", pattern)))
	var out []listed
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		out = append(out, p)
	}
}

func goCmd(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}
