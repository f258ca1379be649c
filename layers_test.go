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
	out := goCmd(t, "list", "-json=ImportPath,Deps,TestImports,XTestImports", "./...")
	dec := json.NewDecoder(strings.NewReader(out))
	seen := 0
	for {
		var p struct {
			ImportPath   string
			Deps         []string
			TestImports  []string
			XTestImports []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
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
// agent/pin, agent/automax, agent/record, ...) depends, directly or not,
// on the agent package itself: the agent is the door that wires the rooms
// through narrow interfaces, and a room never knows the *Agent.
func TestRoomsDoNotImportAgent(t *testing.T) {
	module := strings.TrimSpace(goCmd(t, "list", "-m"))
	door := module + "/agent"
	out := goCmd(t, "list", "-json=ImportPath,Deps", "./agent/...")
	dec := json.NewDecoder(strings.NewReader(out))
	rooms := 0
	for {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		if !strings.HasPrefix(p.ImportPath, door+"/") {
			continue
		}
		rooms++
		for _, d := range p.Deps {
			if d == door {
				t.Errorf("%s depends on %s: a room of the agent imports the door", p.ImportPath, d)
			}
		}
	}
	if rooms < 3 {
		t.Fatalf("go list found %d packages under %s; want its rooms (pin, automax, record)", rooms, door)
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

// TestFeaturesAvoidAgent fails when a feature package under agent/ (fleet,
// ...) depends on the agent package itself, directly or not, or its tests
// import it: a feature meets the agent only through the narrow interfaces
// it defines, and the agent is the door that wires them.
func TestFeaturesAvoidAgent(t *testing.T) {
	module := strings.TrimSpace(goCmd(t, "list", "-m"))
	agent := module + "/agent"
	out := goCmd(t, "list", "-json=ImportPath,Deps,TestImports,XTestImports", "./agent/...")
	dec := json.NewDecoder(strings.NewReader(out))
	features := map[string]bool{}
	for {
		var p struct {
			ImportPath   string
			Deps         []string
			TestImports  []string
			XTestImports []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		if !strings.HasPrefix(p.ImportPath, agent+"/") {
			continue
		}
		features[strings.TrimPrefix(p.ImportPath, module+"/")] = true
		for _, d := range append(append(p.Deps, p.TestImports...), p.XTestImports...) {
			if d == agent {
				t.Errorf("%s depends on %s: a feature package never imports the agent", p.ImportPath, agent)
			}
		}
	}
	if !features["agent/fleet"] {
		t.Fatalf("go list found no agent/fleet among %v", features)
	}
}
