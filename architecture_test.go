package tierlimit_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// architecturePage is the map a newcomer opens first: every agent room,
// C header and YAML block parser is named there.
const architecturePage = "docs/architecture.md"

// named reports whether text names name as a whole word (not inside a
// longer name: parse.h is not named by parse_ip.h).
func named(text, name string) bool {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_.])` + regexp.QuoteMeta(name) + `($|[^A-Za-z0-9_])`).MatchString(text)
}

// TestArchitectureNamesRooms fails when docs/architecture.md leaves out an
// agent room (a package directory under agent/, named agent/<dir>), a C
// room (bpf/*.h, named by its file name) or a policy block's parser
// (tiers/yaml_*.go), so that the map cannot drift from the tree. It also
// fails when bpf/limiter.c's room list leaves out a header.
func TestArchitectureNamesRooms(t *testing.T) {
	data, err := os.ReadFile(architecturePage)
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	var want []string
	rooms, err := os.ReadDir("agent")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rooms {
		if !e.IsDir() {
			continue
		}
		gos, _ := filepath.Glob(filepath.Join("agent", e.Name(), "*.go"))
		if len(gos) > 0 {
			want = append(want, "agent/"+e.Name())
		}
	}
	headers, err := filepath.Glob("bpf/*.h")
	if err != nil {
		t.Fatal(err)
	}
	yamls, err := filepath.Glob("tiers/yaml_*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range yamls {
		if !strings.HasSuffix(f, "_test.go") {
			want = append(want, filepath.Base(f))
		}
	}
	for _, h := range headers {
		want = append(want, filepath.Base(h))
	}
	if len(want) == 0 {
		t.Fatal("no agent rooms, headers or YAML parsers found: run from the module root")
	}
	for _, name := range want {
		if !named(page, name) {
			t.Errorf("%s does not name %s: add it to its table or its list of rooms", architecturePage, name)
		}
	}

	src, err := os.ReadFile("bpf/limiter.c")
	if err != nil {
		t.Fatal(err)
	}
	// The comment above the includes: the program's list of its rooms.
	list, _, _ := strings.Cut(string(src), "#include")
	for _, h := range headers {
		if !named(list, filepath.Base(h)) {
			t.Errorf("bpf/limiter.c's list of rooms (its first comment) does not name %s", filepath.Base(h))
		}
	}
}
