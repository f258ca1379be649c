package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the module's root directory, from this file's path.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// UnitCaps returns the capabilities that the shipped service gives the
// agent, lower case without CAP_ (net_admin, bpf, ...): the packaged
// unit's CapabilityBoundingSet= and AmbientCapabilities=
// (deploy/systemd/tierlimit.service) and the DaemonSet's
// securityContext.capabilities.add (deploy/kubernetes/daemonset.yaml). It
// fails tb when the three disagree: then there is no one set to test.
func UnitCaps(tb testing.TB) []string {
	tb.Helper()
	unit, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "systemd", "tierlimit.service"))
	if err != nil {
		tb.Fatal(err)
	}
	ds, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "kubernetes", "daemonset.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	set := func(what string, re *regexp.Regexp, text []byte, sep string) []string {
		m := re.FindSubmatch(text)
		if m == nil {
			tb.Fatalf("no %s in the shipped manifests", what)
		}
		var caps []string
		for _, c := range strings.Split(string(m[1]), sep) {
			if c = strings.TrimSpace(c); c != "" {
				caps = append(caps, strings.ToLower(strings.TrimPrefix(c, "CAP_")))
			}
		}
		slices.Sort(caps)
		return caps
	}
	bounding := set("CapabilityBoundingSet=", regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.*)$`), unit, " ")
	ambient := set("AmbientCapabilities=", regexp.MustCompile(`(?m)^AmbientCapabilities=(.*)$`), unit, " ")
	added := set("capabilities.add", regexp.MustCompile(`(?m)^\s*add:\s*\[([^\]]*)\]`), ds, ",")
	if !slices.Equal(bounding, ambient) || !slices.Equal(bounding, added) {
		tb.Fatalf("the unit's bounding set %v, its ambient set %v and the DaemonSet's %v differ", bounding, ambient, added)
	}
	return bounding
}

// AsUnit is name with args run inside ns as the shipped service runs the
// agent: uid 0 with exactly UnitCaps (bounding, inheritable, ambient, and
// so permitted and effective), the noroot securebits locked so that uid 0
// gains nothing at exec (the unit's SecureBits=noroot-locked), and
// no_new_privs (NoNewPrivileges=yes). It runs through setpriv(1) from
// util-linux, which tb fails without.
func AsUnit(tb testing.TB, ctx context.Context, ns *NS, name string, args ...string) *exec.Cmd {
	tb.Helper()
	if _, err := exec.LookPath("setpriv"); err != nil {
		tb.Fatal("setpriv (util-linux) not installed")
	}
	caps := "-all"
	for _, c := range UnitCaps(tb) {
		caps += ",+" + c
	}
	return ns.Command(ctx, "setpriv", append([]string{
		"--bounding-set=" + caps, "--inh-caps=" + caps, "--ambient-caps=" + caps,
		"--securebits=+noroot,+noroot_locked", "--no-new-privs", "--", name}, args...)...)
}
