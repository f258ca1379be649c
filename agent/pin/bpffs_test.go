package pin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestJudgeBPFFS is the rule of judgeBPFFS, case by case: what a bpffs
// looks like from each place the agent may run (issue 26).
func TestJudgeBPFFS(t *testing.T) {
	host := BPFFSMount{Dir: "/sys/fs/bpf", FSType: "bpf", Mount: "/sys/fs/bpf", Dev: "0:39", HostPID1: true, PID1Read: true}
	with := func(f func(*BPFFSMount)) BPFFSMount { m := host; f(&m); return m }
	for _, tc := range []struct {
		name               string
		m                  BPFFSMount
		mounted            bool
		outlives, verified bool
		reason             string
	}{
		{"host, the initial mount namespace (6.18)", with(func(m *BPFFSMount) { m.InitialMountNS = true }), false, true, true, "initial mount namespace"},
		{"host, bpffs the agent mounted in the initial mount namespace", with(func(m *BPFFSMount) { m.InitialMountNS = true }), true, true, true, "initial mount namespace"},
		{"host bpffs, also PID 1's (nsenter --net, unshare -m, systemd PrivateMounts)", with(func(m *BPFFSMount) { m.InPID1 = true }), false, true, true, "same bpffs instance"},
		{"the agent mounted it, PID 1 has it (a host without bpffs)", with(func(m *BPFFSMount) { m.InPID1 = true }), true, true, true, "same bpffs instance"},
		{"ip netns exec: the agent mounted it, PID 1 has not", host, true, false, true, "the agent mounted it"},
		{"unshare -m: a wrapper mounted it, PID 1 has not", host, false, false, true, "private to the agent's mount namespace"},
		{"container: the agent mounted it", with(func(m *BPFFSMount) { m.HostPID1 = false }), true, false, false, "PID namespace"},
		{"container: hostPath bpffs", with(func(m *BPFFSMount) { m.HostPID1 = false }), false, true, false, "PID namespace"},
		{"container, PID 1 has it too: still the container's init", with(func(m *BPFFSMount) { m.HostPID1, m.InPID1 = false, true }), false, true, false, "cannot be checked"},
		{"/proc/1 hidden (ProtectProc=invisible)", with(func(m *BPFFSMount) { m.PID1Read = false }), false, true, false, "cannot be read"},
		{"/proc/1 hidden, the agent mounted it", with(func(m *BPFFSMount) { m.PID1Read = false }), true, false, false, "cannot be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := judgeBPFFS(tc.m, tc.mounted)
			if l.Outlives != tc.outlives || l.Verified != tc.verified || !strings.Contains(l.Reason, tc.reason) {
				t.Fatalf("outlives %v verified %v (%s), want %v %v (%q)", l.Outlives, l.Verified, l.Reason, tc.outlives, tc.verified, tc.reason)
			}
		})
	}
}

func TestParseMountinfo(t *testing.T) {
	const info = `22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
44 22 0:39 / /sys/fs/bpf rw,relatime shared:9 master:3 - bpf bpf rw
45 1 0:40 / /run/my\040pins rw - bpf bpf rw,mode=700
46 45 0:41 / /run/my\040pins/inner rw - bpf none rw
47 1 0:39 /sub /mnt/bind rw - bpf bpf rw
bad line
`
	got := parseMountinfo(strings.NewReader(info))
	want := []mountinfoEntry{
		{"0:21", "/sys", "sysfs"}, {"0:39", "/sys/fs/bpf", "bpf"}, {"0:40", "/run/my pins", "bpf"},
		{"0:41", "/run/my pins/inner", "bpf"}, {"0:39", "/mnt/bind", "bpf"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("parsed\n%v\nwant\n%v", got, want)
	}
	for _, tc := range []struct{ dir, dev, want string }{
		{"/sys/fs/bpf", "0:39", "/sys/fs/bpf"},
		{"/run/my pins", "0:40", "/run/my pins"},
		{"/run/my pins/inner/x", "0:41", "/run/my pins/inner"},
		{"/sys/fs/bpfx", "0:39", ""},
	} {
		if got := mountPointOf(strings.NewReader(info), tc.dir, tc.dev); got != tc.want {
			t.Errorf("mountPointOf(%q, %s) = %q, want %q", tc.dir, tc.dev, got, tc.want)
		}
	}
	if !hasBPFFS(strings.NewReader(info), "0:40") || hasBPFFS(strings.NewReader(info), "0:21") {
		t.Error("hasBPFFS: 0:40 is a bpffs, 0:21 is sysfs")
	}
}

// fakeProc is a /proc holding mountinfo files and namespace links.
func fakeProc(t *testing.T, self, one string, links map[string]string) procMounts {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"self/ns", "1/ns"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"self/mountinfo": self, "1/mountinfo": one} {
		if body == "" {
			continue // unreadable, as under hidepid
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return procMounts{root: root}
}

// TestReadBPFFSMount reads a real bpffs's device number and matches it
// against mountinfo files and namespace links written for the test.
func TestReadBPFFSMount(t *testing.T) {
	testenv.Require(t)
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	line := fmt.Sprintf("90 1 %s / %s rw - bpf bpf rw\n", dev, dir)
	hostNS := map[string]string{"self/ns/pid": "pid:[4026531836]", "self/ns/mnt": "mnt:[4026532200]"}

	m := readBPFFSMount(dir, fakeProc(t, line, line, hostNS))
	if m.Mount != dir || m.Dev != dev || !m.InPID1 || !m.PID1Read || !m.HostPID1 || m.MountNSKnown || m.InitialMountNS {
		t.Fatalf("the host's own: %+v", m)
	}
	if l := judgeBPFFS(m, false); !l.Outlives || !l.Verified {
		t.Fatalf("a bpffs PID 1 has: %+v", l)
	}
	m = readBPFFSMount(dir, fakeProc(t, line, "1 0 0:39 / /sys/fs/bpf rw - bpf bpf rw\n", hostNS))
	if m.InPID1 || !m.PID1Read {
		t.Fatalf("PID 1 has another instance: %+v", m)
	}
	if l := judgeBPFFS(m, false); l.Outlives || !l.Verified {
		t.Fatalf("a bpffs PID 1 has not: %+v", l)
	}
	m = readBPFFSMount(dir, fakeProc(t, line, "", map[string]string{"self/ns/pid": "pid:[4026532300]", "self/ns/mnt": "mnt:[4026531832]", "1/ns/mnt": "mnt:[4026531832]"}))
	if m.PID1Read || m.HostPID1 || !m.InitialMountNS || !m.MountNSKnown || !m.SameMountNS {
		t.Fatalf("initial mount namespace, /proc/1 unreadable: %+v", m)
	}
	if m := readBPFFSMount(t.TempDir(), procMounts{}); m.OnBPFFS() || m.FSType == "bpf" {
		t.Fatalf("a temp dir is no bpffs: %+v", m)
	}
}

// TestPrivateBPFFSErrorWraps: the refusal is ErrPrivateBPFFS, which cmd
// maps to exit 2, and names the mount, the pin path and the reason. (The
// refusal itself needs a private mount namespace: cmd/tierlimit's
// bpffs_test.go runs the binary in them.)
func TestPrivateBPFFSErrorWraps(t *testing.T) {
	err := error(&PrivateBPFFSError{Pin: "/sys/fs/bpf/x", Life: judgeBPFFS(BPFFSMount{Dir: "/sys/fs/bpf", FSType: "bpf", Mount: "/sys/fs/bpf", Dev: "0:77", HostPID1: true, PID1Read: true}, true)})
	if !errors.Is(err, ErrPrivateBPFFS) {
		t.Fatal("PrivateBPFFSError does not wrap ErrPrivateBPFFS")
	}
	for _, want := range []string{"refusing to pin", "bpffs mounted at /sys/fs/bpf (dev 0:77)", "/sys/fs/bpf/x", "the agent mounted it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}
