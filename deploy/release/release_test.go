package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestRelease checks the packages of `make release`: with
// TIERLIMIT_RELEASE_DIST=dir (CI, after make release) those in dir for
// every architecture there; else it builds the host's architecture into a
// temporary directory the way the Makefile does and packages it.
func TestRelease(t *testing.T) {
	s := spec{Version: "9.8.7", Commit: "0123456789abcdef0123456789abcdef01234567", Repo: "../..", Arches: []string{runtime.GOARCH}}
	if d := os.Getenv("TIERLIMIT_RELEASE_DIST"); d != "" {
		s.Dist = d
		s.Version, s.Commit = "", ""
		s.Arches = nil
		for _, a := range []string{"amd64", "arm64"} {
			if _, err := os.Stat(s.binary(a)); err == nil {
				s.Arches = append(s.Arches, a)
			}
		}
		if len(s.Arches) == 0 {
			t.Fatalf("TIERLIMIT_RELEASE_DIST=%s holds no tierlimit-linux-ARCH", d)
		}
	} else {
		s.Dist = t.TempDir()
		buildStatic(t, s)
		if err := release(s); err != nil {
			t.Fatal(err)
		}
	}
	for _, arch := range s.Arches {
		t.Run("deb-"+arch, func(t *testing.T) { checkDeb(t, s, arch) })
	}
	t.Run("oci", func(t *testing.T) { checkImage(t, s) })
}

// buildStatic builds the host's binary as make release does.
func buildStatic(t *testing.T, s spec) {
	t.Helper()
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -X main.version="+s.Version+" -X main.commit="+s.Commit,
		"-o", s.binary(runtime.GOARCH), "./cmd/tierlimit")
	cmd.Dir = s.Repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

// checkBinary checks that bin is a static ELF for arch and, on the host's
// architecture, that `version` prints the stamped version and commit.
func checkBinary(t *testing.T, s spec, arch string, bin []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("binary: %v", err)
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != want {
		t.Errorf("binary for %s is %v, want %v", arch, f.Machine, want)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary for %s is dynamically linked (%v): want CGO_ENABLED=0", arch, p.Type)
		}
	}
	if arch != runtime.GOARCH {
		return
	}
	path := filepath.Join(t.TempDir(), "tierlimit")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, "version").Output()
	if err != nil {
		t.Fatalf("tierlimit version: %v", err)
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	if s.Version != "" && (fields["version"] != s.Version || fields["commit"] != s.Commit) {
		t.Errorf("tierlimit version printed %q, want version %s and commit %s", out, s.Version, s.Commit)
	}
	if fields["version"] == "" || fields["version"] == "dev" || len(strings.TrimSuffix(fields["commit"], "-dirty")) != 40 {
		t.Errorf("tierlimit version printed %q: want a stamped version and a full commit", out)
	}
}

func checkDeb(t *testing.T, s spec, arch string) {
	debs, _ := filepath.Glob(filepath.Join(s.Dist, "tierlimit_*_"+arch+".deb"))
	if len(debs) != 1 {
		t.Fatalf("want one .deb for %s in %s, found %v", arch, s.Dist, debs)
	}
	deb := debs[0]
	field := func(name string) string {
		out, err := exec.Command("dpkg-deb", "-f", deb, name).Output()
		if err != nil {
			t.Fatalf("dpkg-deb -f %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := field("Package"); got != "tierlimit" {
		t.Errorf("Package %q", got)
	}
	if got := field("Architecture"); got != arch {
		t.Errorf("Architecture %q, want %s", got, arch)
	}
	dir := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-R", deb, dir).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -R: %v\n%s", err, out)
	}
	conffiles, err := os.ReadFile(filepath.Join(dir, "DEBIAN", "conffiles"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(conffiles)), []string{debDefault, debPolicy}; !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Errorf("conffiles %v, want %v", got, want)
	}
	shipped := map[string]string{
		debPolicy:  "tiers/default.yaml",
		debDefault: "deploy/systemd/tierlimit.default",
		debUnit:    "deploy/systemd/tierlimit.service",
		debReadme:  "README.md",
		debBinary:  "",
	}
	pages, err := docPages(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"design.md", "policy.md", "operations.md"} {
		if !slices.Contains(pages, want) {
			t.Errorf("docs/ lacks %s: the README links it", want)
		}
	}
	for _, name := range pages {
		shipped[debDocs+"/"+name] = "docs/" + name
	}
	for dst, src := range shipped {
		got, err := os.ReadFile(filepath.Join(dir, dst))
		if err != nil {
			t.Errorf("%s: %v", dst, err)
			continue
		}
		if src == "" {
			checkBinary(t, s, arch, got)
			continue
		}
		if want, _ := os.ReadFile(s.repoFile(src)); !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s", dst, src)
		}
	}
}

// checkImage validates the OCI layout (every digest and size, with
// go-containerregistry's validate) and each architecture's image: its
// config, its files, and the docker-load tarball holding the same image.
func checkImage(t *testing.T, s spec) {
	p, err := layout.FromPath(filepath.Join(s.Dist, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Annotations[imageRefName] == "" {
		t.Fatalf("index.json: %+v, want one index tagged with %s", tm.Manifests, imageRefName)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("validate OCI index: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var arches []string
	for _, d := range im.Manifests {
		arches = append(arches, d.Platform.Architecture)
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkArchImage(t, s, d.Platform.Architecture, img)
		tarImg, err := tarball.ImageFromPath(filepath.Join(s.Dist, "tierlimit_"+tm.Manifests[0].Annotations[imageRefName]+"_"+d.Platform.Architecture+".image.tar"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(tarImg); err != nil {
			t.Errorf("validate image tarball for %s: %v", d.Platform.Architecture, err)
		}
		// The tarball's manifest is docker's; its config (and so the
		// layers' diff IDs) must be the layout's.
		got, _ := tarImg.ConfigName()
		if want, _ := img.ConfigName(); got != want {
			t.Errorf("image tarball for %s: config %v, want the layout's %v", d.Platform.Architecture, got, want)
		}
	}
	if !slices.Equal(arches, s.Arches) {
		t.Errorf("image platforms %v, want %v", arches, s.Arches)
	}
}

func checkArchImage(t *testing.T, s spec, arch string, img v1.Image) {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != arch || !slices.Equal(cf.Config.Entrypoint, []string{"/" + imageBinary}) {
		t.Errorf("image config %s/%s entrypoint %v", cf.OS, cf.Architecture, cf.Config.Entrypoint)
	}
	files := map[string][]byte{}
	modes := map[string]int64{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name], modes[h.Name] = b, h.Mode
	}
	policy, _ := os.ReadFile(s.repoFile("tiers/default.yaml"))
	if !bytes.Equal(files[imagePolicy], policy) {
		t.Errorf("image %s: %s is not tiers/default.yaml", arch, imagePolicy)
	}
	bin, _ := os.ReadFile(s.binary(arch))
	if !bytes.Equal(files[imageBinary], bin) || modes[imageBinary] != 0o755 {
		t.Errorf("image %s: %s (mode %o) is not the release binary with mode 755", arch, imageBinary, modes[imageBinary])
	}
	checkBinary(t, s, arch, files[imageBinary])
}
