package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
)

// Where the Debian package installs its files.
const (
	debBinary  = "/usr/bin/tierlimit"
	debUnit    = "/lib/systemd/system/tierlimit.service"
	debPolicy  = "/etc/tierlimit/policy.yaml"
	debDefault = "/etc/default/tierlimit"
	debReadme  = "/usr/share/doc/tierlimit/README.md"
	// debDocs holds the repository's docs/*.md beside README.md, so that
	// the README's links into docs/ resolve in the installed copy too.
	debDocs = "/usr/share/doc/tierlimit/docs"
)

// docPages lists the repository's docs/*.md by name: the contract, the
// policy reference, operations and the rest. An empty list is an error, so
// that a package never ships a README whose links lead nowhere.
func docPages(s spec) ([]string, error) {
	pages, err := filepath.Glob(filepath.Join(s.repoFile("docs"), "*.md"))
	if err != nil {
		return nil, err
	}
	if len(pages) == 0 {
		return nil, fmt.Errorf("no docs/*.md in %s", s.Repo)
	}
	names := make([]string, len(pages))
	for i, p := range pages {
		names[i] = filepath.Base(p)
	}
	return names, nil
}

// Maintainer scripts. The service is not enabled or started on install: it
// needs TIERLIMIT_IFACES first. An upgrade restarts a running service, which
// adopts the pinned limiter with no attach gap; a removal stops it and
// detaches the limiter, which would otherwise keep shedding with no binary
// left to remove it: detach --all --everything, from every interface whatever holds it
// (a link pinned under another --pin-path, an interface dropped from
// TIERLIMIT_IFACES since), and every pin path an agent recorded.
//
// dpkg calls postinst configure with the last configured version also
// when the package was removed (its conffiles kept) and is installed
// again: that is no upgrade of a running service. So the prerm of a
// removal records, in reinstallMark, that the service was enabled or
// running, and the postinst that finds the mark starts it: the limiter
// comes back with the package, not at the next boot. A purge drops it.
const (
	reinstallMark = "/var/lib/tierlimit/.start-on-reinstall"
	postinst      = `#!/bin/sh
set -e
mark=` + reinstallMark + `
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	if [ "$1" = configure ] && [ -e "$mark" ]; then
		# installed again after a remove that stopped it
		systemctl start tierlimit.service || true
	elif [ "$1" = configure ] && [ -n "$2" ]; then
		systemctl try-restart tierlimit.service || true
	fi
fi
if [ "$1" = configure ]; then
	rm -f "$mark"
fi
if [ "$1" = configure ] && [ -z "$2" ]; then
	echo "tierlimit: set TIERLIMIT_IFACES in /etc/default/tierlimit, then: systemctl enable --now tierlimit"
fi
`
	prerm = `#!/bin/sh
set -e
mark=` + reinstallMark + `
if [ "$1" = remove ]; then
	if [ -d /run/systemd/system ]; then
		if systemctl --quiet is-enabled tierlimit.service 2>/dev/null || systemctl --quiet is-active tierlimit.service 2>/dev/null; then
			mkdir -p "$(dirname "$mark")" && touch "$mark" || true
		fi
		systemctl stop tierlimit.service || true
	fi
	/usr/bin/tierlimit detach --all --everything || true
fi
`
	postrm = `#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
if [ "$1" = purge ]; then
	rm -rf /run/tierlimit
	rm -f ` + reinstallMark + `
fi
`
)

// buildDeb writes dist/tierlimit_VERSION_ARCH.deb and returns its path.
func buildDeb(s spec, arch string) (string, error) {
	if _, err := os.Stat(s.binary(arch)); err != nil {
		return "", fmt.Errorf("binary: %w (run make release)", err)
	}
	scripts, err := writeScripts(map[string]string{"postinst": postinst, "prerm": prerm, "postrm": postrm})
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scripts)
	file := func(src, dst string, mode os.FileMode, typ string) *files.Content {
		return &files.Content{Source: src, Destination: dst, Type: typ, FileInfo: &files.ContentFileInfo{Mode: mode}}
	}
	pages, err := docPages(s)
	if err != nil {
		return "", err
	}
	contents := files.Contents{
		file(s.binary(arch), debBinary, 0o755, ""),
		file(s.repoFile("deploy/systemd/tierlimit.service"), debUnit, 0o644, ""),
		file(s.repoFile("tiers/default.yaml"), debPolicy, 0o644, files.TypeConfigNoReplace),
		file(s.repoFile("deploy/systemd/tierlimit.default"), debDefault, 0o644, files.TypeConfigNoReplace),
		file(s.repoFile("README.md"), debReadme, 0o644, ""),
	}
	for _, name := range pages {
		contents = append(contents, file(s.repoFile("docs/"+name), debDocs+"/"+name, 0o644, ""))
	}
	info := nfpm.WithDefaults(&nfpm.Info{
		Name:        "tierlimit",
		Arch:        arch,
		Platform:    "linux",
		Version:     s.Version,
		Section:     "net",
		Priority:    "optional",
		Maintainer:  "The tierlimit Authors <tierlimit@localhost>",
		Description: "XDP tiered load shedding for syslog collectors\nCounts the selected syslog packets of each window at the NIC and, past each\ntier's threshold, drops them at random at that tier's rate (commit " + s.Commit + ").",
		License:     "MIT",
		Overridables: nfpm.Overridables{
			Contents: contents,
			Scripts: nfpm.Scripts{
				PostInstall: filepath.Join(scripts, "postinst"),
				PreRemove:   filepath.Join(scripts, "prerm"),
				PostRemove:  filepath.Join(scripts, "postrm"),
			},
		},
	})
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return "", err
	}
	pkgr, err := nfpm.Get("deb")
	if err != nil {
		return "", err
	}
	out := filepath.Join(s.Dist, fmt.Sprintf("tierlimit_%s_%s.deb", s.Version, arch))
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	if err := pkgr.Package(info, f); err != nil {
		f.Close()
		return "", err
	}
	return out, f.Close()
}

// writeScripts writes each named script into a new temporary directory.
func writeScripts(scripts map[string]string) (string, error) {
	dir, err := os.MkdirTemp("", "tierlimit-deb-")
	if err != nil {
		return "", err
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}
