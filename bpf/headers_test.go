package bpf_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// makeVar matches a Makefile default, "NAME ?= value", as the Makefile
// pins the compiler (CLANG_VERSION) and its flags (BPF2GO_CFLAGS).
func makeVar(t *testing.T, mk []byte, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + ` \?= *(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatalf("../Makefile: no %s ?= line", name)
	}
	return strings.TrimSpace(string(m[1]))
}

// headerVariants are the builds of gen.go's generate lines: the program,
// its stage build and its perf build, each with its own defines.
var headerVariants = [][]string{nil, {"-DTL_BENCH_STAGES"}, {"-DTL_RECORD_PERF"}}

// TestHeadersStandalone compiles each bpf/*.h alone, as the first and only
// include of an empty file, with the Makefile's pinned clang and
// BPF2GO_CFLAGS, in each build of gen.go: a header must include what it
// uses, so that none compiles only when pasted after another. Unused
// static functions are allowed (-Wno-unused-function): a header's callers
// are its includers. It also fails on an #include below a header's first
// declaration (a header read in the middle of another). Without the pinned
// clang it skips, or fails with TIERLIMIT_REQUIRE_BPF=1 (CI installs it).
func TestHeadersStandalone(t *testing.T) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	clang := "clang-" + makeVar(t, mk, "CLANG_VERSION")
	if _, err := exec.LookPath(clang); err != nil {
		if os.Getenv(testenv.RequireEnv) == "1" {
			t.Fatalf("%s=1 but %s, the Makefile's pinned compiler, is not on the PATH: %v", testenv.RequireEnv, clang, err)
		}
		t.Skipf("skipping: %s, the Makefile's pinned compiler, is not on the PATH (set %s=1 to fail instead)", clang, testenv.RequireEnv)
	}
	cflags := strings.Fields(makeVar(t, mk, "BPF2GO_CFLAGS"))
	headers, err := filepath.Glob("*.h")
	if err != nil {
		t.Fatal(err)
	}
	if len(headers) == 0 {
		t.Fatal("no bpf/*.h found")
	}
	for _, h := range headers {
		t.Run(h, func(t *testing.T) {
			checkIncludesAtTop(t, h)
			for _, defs := range headerVariants {
				args := append([]string{"-target", "bpfel", "-fsyntax-only", "-I", "include"}, cflags...)
				args = append(args, "-Wno-unused-function") // after -Wall, which turns it on
				args = append(args, defs...)
				args = append(args, "-include", h, "-x", "c", os.DevNull)
				out, err := exec.Command(clang, args...).CombinedOutput()
				if err != nil || len(bytes.TrimSpace(out)) > 0 {
					t.Errorf("%s %s: %v\n%s", clang, strings.Join(args, " "), err, out)
				}
			}
		})
	}
}

// checkIncludesAtTop fails t when header h has an #include below its first
// C declaration (a line that starts with a letter or an underscore).
func checkIncludesAtTop(t *testing.T, h string) {
	t.Helper()
	f, err := os.Open(h)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	code := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#include"):
			if code > 0 {
				t.Errorf("%s:%d: %s below the first declaration (line %d): include at the top", h, n, line, code)
			}
		case code == 0 && line != "" && (line[0] == '_' || line[0] >= 'a' && line[0] <= 'z' || line[0] >= 'A' && line[0] <= 'Z'):
			code = n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}
