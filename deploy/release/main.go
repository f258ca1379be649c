// Command release packages the static tierlimit binaries that `make release`
// builds: a Debian package per architecture (nfpm) and one multi-arch OCI
// image (go-containerregistry, no container daemon), written to -dist.
//
//	go run ./release -version 1.2.3 -commit abc -repo .. -dist ../dist -arch amd64,arm64
//
// It reads dist/tierlimit-linux-ARCH (the binaries) and, from the repository,
// deploy/systemd/tierlimit.{service,default}, tiers/default.yaml (installed
// as /etc/tierlimit/policy.yaml), README.md and docs/*.md. It writes
// dist/tierlimit_VERSION_ARCH.deb, the OCI image layout dist/oci/ and, for
// `docker load` or `podman load`, dist/tierlimit_VERSION_ARCH.image.tar.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// spec says what to package and where.
type spec struct {
	Version string   // package version, e.g. 1.2.3 or 0.0.0-dev
	Commit  string   // VCS commit the binaries were built from
	Repo    string   // repository root (the unit, the default policy, README.md, docs/)
	Dist    string   // directory of the binaries and of the outputs
	Arches  []string // GOARCH values: amd64, arm64
}

// binary is the path of the static binary for arch.
func (s spec) binary(arch string) string {
	return filepath.Join(s.Dist, "tierlimit-linux-"+arch)
}

// repoFile is the path of a file of the repository, by its path there.
func (s spec) repoFile(rel string) string { return filepath.Join(s.Repo, filepath.FromSlash(rel)) }

func main() {
	var s spec
	var arches string
	flag.StringVar(&s.Version, "version", "", "package version (required), e.g. 1.2.3")
	flag.StringVar(&s.Commit, "commit", "unknown", "commit the binaries were built from")
	flag.StringVar(&s.Repo, "repo", "..", "repository root")
	flag.StringVar(&s.Dist, "dist", "../dist", "directory of tierlimit-linux-ARCH and of the outputs")
	flag.StringVar(&arches, "arch", "amd64,arm64", "comma-separated GOARCH values")
	flag.Parse()
	s.Arches = strings.Split(arches, ",")
	if err := release(s); err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

// release writes every package of s and prints their paths.
func release(s spec) error {
	if s.Version == "" {
		return fmt.Errorf("-version is empty")
	}
	for _, arch := range s.Arches {
		deb, err := buildDeb(s, arch)
		if err != nil {
			return fmt.Errorf("deb for %s: %w", arch, err)
		}
		fmt.Println(deb)
	}
	out, err := buildImage(s)
	if err != nil {
		return fmt.Errorf("OCI image: %w", err)
	}
	for _, p := range out {
		fmt.Println(p)
	}
	return nil
}
