package main

import (
	"path"
	"slices"
	"strings"
	"testing"
)

// A model of how systemd (252, Debian 12's; the rules are the same through
// 257) turns a unit's file system settings into its mount namespace
// (src/core/namespace.c): every setting adds entries (path, mode); entries
// of one path collapse into the one of highest priority, which also becomes
// read-only when any of the dropped ones was (drop_duplicates); a path is
// then governed by the deepest entry above it, since a read-only remount of
// a parent skips the paths of other entries, and is inaccessible under an
// inaccessible entry. It is a model, not systemd: the unit has not been
// started by systemd as PID 1 on this machine (its PID 1 is not systemd).

// mountMode is namespace.c's MountMode, in its order of priority.
type mountMode int

const (
	mInaccessible mountMode = iota
	mBind
	mPrivateTmp
	mPrivateDev
	mReadOnly
	mReadWrite
	mReadWriteImplicit
)

type mountEntry struct {
	path     string
	mode     mountMode
	readOnly bool
}

// protectKernelTunables is namespace.c's table for ProtectKernelTunables=yes.
var protectKernelTunables = []mountEntry{
	{"/proc/acpi", mReadOnly, true}, {"/proc/apm", mReadOnly, true}, {"/proc/asound", mReadOnly, true},
	{"/proc/bus", mReadOnly, true}, {"/proc/fs", mReadOnly, true}, {"/proc/irq", mReadOnly, true},
	{"/proc/kallsyms", mInaccessible, true}, {"/proc/kcore", mInaccessible, true},
	{"/proc/latency_stats", mReadOnly, true}, {"/proc/mtrr", mReadOnly, true}, {"/proc/scsi", mReadOnly, true},
	{"/proc/sys", mReadOnly, true}, {"/proc/sysrq-trigger", mReadOnly, true}, {"/proc/timer_stats", mReadOnly, true},
	{"/sys", mReadOnly, true}, {"/sys/fs/bpf", mReadOnly, true}, {"/sys/fs/cgroup", mReadWriteImplicit, false},
	{"/sys/fs/selinux", mReadWriteImplicit, false}, {"/sys/kernel/debug", mReadOnly, true}, {"/sys/kernel/tracing", mReadOnly, true},
}

// unitMounts lists the mount entries of a unit's [Service] settings (the
// settings this unit uses).
func unitMounts(u map[string][]string) []mountEntry {
	var out []mountEntry
	paths := func(key string, mode mountMode, ro bool) {
		for _, p := range strings.Fields(strings.Join(u[key], " ")) {
			out = append(out, mountEntry{strings.TrimPrefix(p, "-"), mode, ro})
		}
	}
	paths("ReadWritePaths", mReadWrite, false)
	paths("ReadOnlyPaths", mReadOnly, true)
	paths("InaccessiblePaths", mInaccessible, true)
	paths("BindPaths", mBind, false)
	yes := func(key string) bool { return len(u[key]) > 0 && u[key][len(u[key])-1] == "yes" }
	if yes("ProtectKernelTunables") {
		out = append(out, protectKernelTunables...)
	}
	if yes("ProtectControlGroups") {
		out = append(out, mountEntry{"/sys/fs/cgroup", mReadOnly, true})
	}
	if yes("PrivateTmp") {
		out = append(out, mountEntry{"/tmp", mPrivateTmp, false}, mountEntry{"/var/tmp", mPrivateTmp, false})
	}
	if yes("PrivateDevices") {
		out = append(out, mountEntry{"/dev", mPrivateDev, false})
	}
	if yes("ProtectHome") {
		for _, p := range []string{"/home", "/run/user", "/root"} {
			out = append(out, mountEntry{p, mInaccessible, true})
		}
	}
	if slices.Contains(u["ProtectSystem"], "strict") {
		out = append(out, mountEntry{"/", mReadOnly, true})
		for _, p := range []string{"/proc", "/sys", "/dev", "/home", "/run/user", "/root"} {
			out = append(out, mountEntry{p, mReadWriteImplicit, false})
		}
	}
	return out
}

// access says what a unit's process can do at p: "rw", "ro" or "none".
func access(entries []mountEntry, p string) string {
	byPath := map[string]mountEntry{}
	for _, e := range entries {
		prev, ok := byPath[e.path]
		switch {
		case !ok:
			byPath[e.path] = e
		case e.mode < prev.mode:
			e.readOnly = e.readOnly || prev.readOnly
			byPath[e.path] = e
		default:
			prev.readOnly = prev.readOnly || e.readOnly
			byPath[e.path] = prev
		}
	}
	best, found := mountEntry{}, false
	for q := path.Clean(p); ; q = path.Dir(q) {
		if e, ok := byPath[q]; ok {
			if e.mode == mInaccessible {
				return "none"
			}
			if !found {
				best, found = e, true
			}
		}
		if q == "/" {
			break
		}
	}
	if found && best.readOnly {
		return "ro"
	}
	return "rw"
}

// TestServiceUnitMounts: in the model of systemd's namespace, the shipped
// unit can write its pins and its lock, and loses none of what
// ProtectKernelTunables=yes protects but the bpffs; the unit as it was
// (ProtectKernelTunables=yes with ReadWritePaths=/sys/fs/bpf), or with
// BindPaths=/sys/fs/bpf, leaves the bpffs read-only (issue 24 part 2), so
// the test can fail.
func TestServiceUnitMounts(t *testing.T) {
	u := unitSettings(t)
	shipped := unitMounts(u)
	for p, want := range map[string]string{
		"/sys/fs/bpf/tierlimit/layout": "rw", "/run/tierlimit/lock": "rw",
		"/sys/class/net/eth0/mtu": "ro", "/sys/kernel/debug/x": "ro", "/sys/fs/cgroup/x": "ro",
		"/proc/sys/net/core/bpf_jit_enable": "ro", "/usr/bin/tierlimit": "ro", "/etc/tierlimit/policy.yaml": "ro",
		"/proc/kallsyms": "none", "/proc/kcore": "none", "/root/x": "none", "/tmp/x": "rw",
	} {
		if got := access(shipped, p); got != want {
			t.Errorf("the unit: %s is %s, want %s", p, got, want)
		}
	}
	for _, e := range protectKernelTunables {
		if e.path == "/sys/fs/bpf" || !e.readOnly {
			continue
		}
		want := access(protectKernelTunables, e.path)
		if got := access(shipped, e.path); got != want && !(want == "ro" && got == "none") {
			t.Errorf("%s: %s, ProtectKernelTunables=yes makes it %s", e.path, got, want)
		}
	}

	old := map[string][]string{"ProtectSystem": {"strict"}, "ProtectKernelTunables": {"yes"}, "ReadWritePaths": {"/sys/fs/bpf /run/tierlimit"}}
	if got := access(unitMounts(old), "/sys/fs/bpf/tierlimit"); got != "ro" {
		t.Errorf("ProtectKernelTunables=yes with ReadWritePaths=/sys/fs/bpf: the model says the bpffs is %s; systemd makes it ro", got)
	}
	old["BindPaths"] = []string{"/sys/fs/bpf"}
	if got := access(unitMounts(old), "/sys/fs/bpf/tierlimit"); got != "ro" {
		t.Errorf("ProtectKernelTunables=yes with BindPaths=/sys/fs/bpf: the model says the bpffs is %s; systemd makes it ro", got)
	}
}
