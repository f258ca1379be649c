package tierlimit_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// designPage is the contract the code cites, in the tree so that every
// reference resolves from a clone.
const designPage = "docs/design.md"

// oldName is the contract's name before it moved into the tree, spelt in
// two parts so that this file does not name it.
var oldName = "DESIGN" + ".md"

var (
	// designHeading matches a section of designPage: "## 6. Fair shedding".
	designHeading = regexp.MustCompile(`^## (\d+)\. `)
	// designRef matches a citation of a section: "docs/design.md §6",
	// "design.md §§6", "design.md's §9", "DESIGN §2", "design.md §6.2" and
	// ranges "design.md §6-§11" or "§6–11". Group 1 is the first section,
	// group 2 the last of a range.
	designRef = regexp.MustCompile(`(?:docs/design\.md|design\.md|DESIGN\.md|DESIGN)(?:'s|’s)? ?§+ ?(\d+)(?:\.\d+)*(?: ?[-–] ?§*(\d+))?`)
	// designTail matches a line that ends in the page's name, whose
	// section may follow at the start of the next line (a wrapped comment).
	designTail = regexp.MustCompile(`(?:docs/design\.md|design\.md|DESIGN\.md|DESIGN)(?:'s|’s)?\s*$`)
	// sectionHead matches a next line that starts with the section.
	sectionHead = regexp.MustCompile(`^§+ ?(\d+)`)
	// oldRef matches the names of the contract that lead nowhere from a
	// clone: the old file name, and the bare "DESIGN §N".
	oldRef = regexp.MustCompile(regexp.QuoteMeta(oldName) + `|\bDESIGN ?§`)
)

// designSections reads the section numbers of designPage's "## N." headings
// and checks that they are 1..12 in order (the contract's sections; the
// code cites them by number).
func designSections(t *testing.T) map[int]bool {
	t.Helper()
	data, err := os.ReadFile(designPage)
	if err != nil {
		t.Fatalf("the contract is not in the tree: %v", err)
	}
	var order []int
	have := map[int]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if m := designHeading.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			order = append(order, n)
			have[n] = true
		}
	}
	for i := 1; i <= 12; i++ {
		if len(order) < i || order[i-1] != i {
			t.Fatalf("%s's sections are %v: want 1 to 12 in order (the contract's sections keep their numbers)", designPage, order)
		}
	}
	return have
}

// trackedTextFiles lists the files git tracks, without the binary ones
// (a NUL byte in the first 8 KiB).
func trackedTextFiles(t *testing.T) map[string][]byte {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := map[string][]byte{}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		data, err := os.ReadFile(name)
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree, not yet in the index
			}
			t.Fatal(err)
		}
		if bytes.IndexByte(data[:min(len(data), 8192)], 0) >= 0 {
			continue
		}
		files[name] = data
	}
	if len(files) == 0 {
		t.Fatal("git ls-files lists no text file")
	}
	return files
}

// commentLead strips what starts a comment line ("//", "/*", "*", "#")
// and the spaces around it.
func commentLead(line string) string {
	line = strings.TrimSpace(line)
	for _, p := range []string{"//", "/*", "*", "#", "+"} {
		line = strings.TrimSpace(strings.TrimPrefix(line, p))
	}
	return line
}

// designRefs returns the sections that text cites, each with its 1-based
// line, a citation wrapped onto the next line included.
func designRefs(text string) [][2]int {
	var refs [][2]int
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		for _, m := range designRef.FindAllStringSubmatch(line, -1) {
			for _, g := range m[1:] {
				if g != "" {
					n, _ := strconv.Atoi(g)
					refs = append(refs, [2]int{i + 1, n})
				}
			}
		}
		if designTail.MatchString(line) && i+1 < len(lines) {
			if m := sectionHead.FindStringSubmatch(commentLead(lines[i+1])); m != nil {
				n, _ := strconv.Atoi(m[1])
				refs = append(refs, [2]int{i + 2, n})
			}
		}
	}
	return refs
}

// TestDesignReferences fails when a file of the repository cites a section
// of the contract that docs/design.md does not have, naming the file and
// line, and when a file outside docs/ names the contract by a name that
// leads nowhere from a clone (the old file name, or a bare "DESIGN §N"):
// the contract is docs/design.md.
func TestDesignReferences(t *testing.T) {
	have := designSections(t)
	files := trackedTextFiles(t)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	cited := 0
	for _, name := range names {
		text := string(files[name])
		for _, r := range designRefs(text) {
			cited++
			if !have[r[1]] {
				t.Errorf("%s:%d cites §%d, which %s does not have", name, r[0], r[1], designPage)
			}
		}
		// docs/ may name the old file (the history), and this file names
		// the old forms as the patterns' examples.
		if strings.HasPrefix(name, "docs/") || name == "design_test.go" {
			continue
		}
		for i, line := range strings.Split(text, "\n") {
			if loc := oldRef.FindStringIndex(line); loc != nil {
				t.Errorf("%s:%d names the contract %q, which is not in the tree: write %s", name, i+1, line[loc[0]:loc[1]], designPage)
			}
		}
	}
	if cited == 0 {
		t.Errorf("no file cites a section of %s: the reference pattern finds nothing", designPage)
	}
	t.Logf("%d citations of %s in %d text files", cited, designPage, len(files))
}

// TestDesignRefPatterns runs the reference patterns on the forms the tree
// uses, so that a pattern that stops matching fails here rather than
// letting every citation pass unchecked.
func TestDesignRefPatterns(t *testing.T) {
	for _, tc := range []struct {
		text string
		want [][2]int
	}{
		{"// judged as docs/design.md §6 says", [][2]int{{1, 6}}},
		{"see design.md §9 and design.md §§10", [][2]int{{1, 9}, {1, 10}}},
		{"the exact n of DESIGN §2's window", [][2]int{{1, 2}}},
		{"as " + oldName + " §11 says; " + oldName + " §2.", [][2]int{{1, 11}, {1, 2}}},
		{"design.md's §9 promises", [][2]int{{1, 9}}},
		{"docs/design.md §6-§11, design.md §6–11", [][2]int{{1, 6}, {1, 11}, {1, 6}, {1, 11}}},
		{"docs/design.md §6.2", [][2]int{{1, 6}}},
		{"/* an unclassified frame (docs/design.md\n * §2), whose port", [][2]int{{2, 2}}},
		{"\t// shedding of UDP syslog (docs/design.md\n\t// §7). nil is off.", [][2]int{{2, 7}}},
		{"RFC 5424 §6.2.1, issue 10 §8, §2 alone", nil},
	} {
		if got := designRefs(tc.text); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("designRefs(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
	for text, want := range map[string]bool{
		"docs/design.md §6":              false,
		"the contract (" + oldName + ")": true,
		"DESIGN §2's exact n":            true,
		"DESIGNER §2":                    false,
		"design.md §9":                   false,
	} {
		if got := oldRef.MatchString(text); got != want {
			t.Errorf("oldRef on %q = %v, want %v", text, got, want)
		}
	}
}
