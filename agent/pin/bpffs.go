package pin

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Whether the pins outlive the agent (issue 26). A pin lives as long as the
// bpffs instance (superblock) that holds it, and an instance lives as long
// as one of its mounts does. `ip netns exec`, `unshare -m` and containers
// give the agent a mount namespace of its own: a bpffs mounted there (by
// the agent, which mounts one when /sys/fs/bpf has none, or by a wrapper
// script) ends with that namespace, that is with the agent, and the
// limiter with it. The check compares the instance's device number (the
// major:minor field of mountinfo: one per superblock) with the bpffs
// mounts PID 1 sees (/proc/1/mountinfo, readable without ptrace rights,
// unlike /proc/1/ns/mnt and /proc/1/root).

const (
	// pidNSInitIno is the inode of the initial PID namespace
	// (PROC_PID_INIT_INO, fixed since Linux 3.8): in it, PID 1 is the
	// host's init.
	pidNSInitIno = 0xEFFFFFFC
	// mntNSInitIno is the inode of the initial mount namespace
	// (MNT_NS_INIT_INO, fixed since Linux 6.18; never a dynamic inode
	// before, which start at 0xF0000000).
	mntNSInitIno = 0xEFFFFFF8
)

// BPFFSMount is the bpffs mount a pin path's parent resolves to, as this
// process's mount namespace sees it.
type BPFFSMount struct {
	// Dir is the pin path's parent, the directory that must be on bpffs.
	Dir string
	// FSType is Dir's file system: "bpf" when it is on bpffs, else what
	// it is instead ("sysfs" under `ip netns exec`).
	FSType string
	// Mount is the mount point of Dir's bpffs; "" when not on bpffs.
	Mount string
	// Dev is the superblock's device number, "major:minor".
	Dev string
	// InPID1 reports whether PID 1's mount namespace has a mount of this
	// bpffs instance; valid when PID1Read.
	InPID1, PID1Read bool
	// HostPID1 is true when PID 1 is the host's init (this process is in
	// the initial PID namespace), false in a container.
	HostPID1 bool
	// SameMountNS: this process's mount namespace is PID 1's; valid when
	// MountNSKnown (reading /proc/1/ns/mnt needs ptrace rights over it).
	SameMountNS, MountNSKnown bool
	// InitialMountNS: this process is in the host's initial mount
	// namespace (known only on Linux >= 6.18).
	InitialMountNS bool
}

// OnBPFFS reports whether Dir is on a bpffs.
func (m BPFFSMount) OnBPFFS() bool { return m.Mount != "" }

// BPFFSLife is whether the pins under a pin path outlive the agent.
type BPFFSLife struct {
	BPFFSMount
	// Outlives: the bpffs instance stays after the agent exits.
	Outlives bool
	// Verified: Outlives was checked; false when it could not be (a
	// container, /proc/1 hidden) and a bpffs the agent did not mount
	// is trusted.
	Verified bool
	// MountedByAgent: this run mounted it, finding none.
	MountedByAgent bool
	// Reason says why, for the log and errors.
	Reason string
}

// PrivateBPFFSError is returned by New when the bpffs at the pin path would
// end with the agent: pinning there would leave the interface unprotected
// once the agent exits. Nothing is attached or pinned. It wraps
// ErrPrivateBPFFS.
type PrivateBPFFSError struct {
	Pin  string
	Life BPFFSLife
}

func (e *PrivateBPFFSError) Error() string {
	return fmt.Sprintf("%v: %s for %s: %s", ErrPrivateBPFFS, describeMount(e.Life.BPFFSMount), e.Pin, e.Life.Reason)
}

func (e *PrivateBPFFSError) Unwrap() error { return ErrPrivateBPFFS }

// ErrPrivateBPFFS is returned by New (*PrivateBPFFSError) when the bpffs
// at the pin path is private to the agent's mount namespace.
var ErrPrivateBPFFS = errors.New("refusing to pin: the pins would end with the agent")

// describeMount words m for logs and errors.
func describeMount(m BPFFSMount) string {
	if !m.OnBPFFS() {
		return fmt.Sprintf("no bpffs is mounted at %s in this mount namespace (it is %s)", m.Dir, m.FSType)
	}
	return fmt.Sprintf("bpffs mounted at %s (dev %s)", m.Mount, m.Dev)
}

// LookupBPFFS resolves the bpffs that pin path pin is (or would be) on, as
// this process sees it: where `status` and `detach` look.
func LookupBPFFS(pin string) BPFFSMount {
	if c, err := CanonicalPinPath(pin); err == nil {
		pin = c
	}
	return readBPFFSMount(filepath.Dir(pin), procMounts{})
}

// procMounts reads mountinfo and namespace links; tests replace it.
type procMounts struct {
	root string // "" for /proc
}

func (p procMounts) open(rel string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(p.proc(), rel))
}

func (p procMounts) readlink(rel string) (string, error) {
	return os.Readlink(filepath.Join(p.proc(), rel))
}

func (p procMounts) proc() string {
	if p.root == "" {
		return "/proc"
	}
	return p.root
}

func readBPFFSMount(dir string, p procMounts) BPFFSMount {
	m := BPFFSMount{Dir: dir, FSType: fsTypeName(dir)}
	var st unix.Stat_t
	if m.FSType != "bpf" || unix.Stat(dir, &st) != nil {
		return m
	}
	m.Dev = fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	m.Mount = dir // refined from mountinfo below
	if f, err := p.open("self/mountinfo"); err == nil {
		if mp := mountPointOf(f, dir, m.Dev); mp != "" {
			m.Mount = mp
		}
		f.Close()
	}
	if f, err := p.open("1/mountinfo"); err == nil {
		m.PID1Read = true
		m.InPID1 = hasBPFFS(f, m.Dev)
		f.Close()
	}
	self, serr := p.readlink("self/ns/mnt")
	one, oerr := p.readlink("1/ns/mnt")
	m.MountNSKnown = serr == nil && oerr == nil
	m.SameMountNS = m.MountNSKnown && self == one
	m.InitialMountNS = serr == nil && self == fmt.Sprintf("mnt:[%d]", mntNSInitIno)
	pid, err := p.readlink("self/ns/pid")
	m.HostPID1 = err == nil && pid == fmt.Sprintf("pid:[%d]", pidNSInitIno)
	return m
}

// fsTypeName names dir's file system type, for messages.
func fsTypeName(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "missing: " + err.Error()
	}
	switch uint32(st.Type) {
	case unix.BPF_FS_MAGIC:
		return "bpf"
	case unix.SYSFS_MAGIC:
		return "sysfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	}
	return fmt.Sprintf("file system type %#x", uint32(st.Type))
}

// mountinfoEntry is one line of /proc/PID/mountinfo (proc(5)).
type mountinfoEntry struct {
	dev, point, fstype string
}

func parseMountinfo(r io.Reader) []mountinfoEntry {
	var out []mountinfoEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// "44 22 0:39 / /sys/fs/bpf rw,relatime shared:9 - bpf bpf rw"
		f := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+1 >= len(f) {
			continue
		}
		out = append(out, mountinfoEntry{dev: f[2], point: unescapeMount(f[4]), fstype: f[sep+1]})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountPointOf is the deepest bpf mount of device dev that holds dir.
func mountPointOf(r io.Reader, dir, dev string) string {
	best := ""
	for _, e := range parseMountinfo(r) {
		if e.fstype != "bpf" || e.dev != dev {
			continue
		}
		if (dir == e.point || strings.HasPrefix(dir, strings.TrimSuffix(e.point, "/")+"/")) && len(e.point) > len(best) {
			best = e.point
		}
	}
	return best
}

// hasBPFFS reports whether mountinfo r lists a bpf mount of device dev.
func hasBPFFS(r io.Reader, dev string) bool {
	for _, e := range parseMountinfo(r) {
		if e.fstype == "bpf" && e.dev == dev {
			return true
		}
	}
	return false
}

// judgeBPFFS decides whether the bpffs m outlives the agent, which mounted
// it itself when mounted is set. The rule, first match:
//
//  1. in the host's initial mount namespace: it outlives (verified);
//  2. PID 1 is the host's init and its mounts can be read: it outlives
//     exactly when PID 1's mount namespace has a mount of the same
//     instance (verified);
//  3. the agent mounted it: it ends (a mount the agent made lives as long
//     as the agent's mount namespace, which it cannot show outlives it);
//  4. otherwise it is trusted, unverified: in a container PID 1 is the
//     container's init and the host's mounts cannot be seen, and with
//     /proc/1 hidden (hidepid, for a process outside procfs's gid)
//     nothing can be.
func judgeBPFFS(m BPFFSMount, mounted bool) BPFFSLife {
	l := BPFFSLife{BPFFSMount: m, MountedByAgent: mounted}
	by := ""
	if mounted {
		by = "the agent mounted it, finding none at " + m.Dir + ", and "
	}
	switch {
	case m.InitialMountNS:
		l.Outlives, l.Verified, l.Reason = true, true, "it is mounted in the host's initial mount namespace"
	case m.HostPID1 && m.PID1Read && m.InPID1:
		l.Outlives, l.Verified, l.Reason = true, true, "the same bpffs instance is mounted in PID 1's mount namespace"
	case m.HostPID1 && m.PID1Read:
		l.Verified = true
		l.Reason = by + "no mount of this bpffs instance is in PID 1's (the host's) mount namespace: it is private to the agent's mount namespace (ip netns exec, unshare -m, a container without the host's bpffs) and ends with it"
	case mounted:
		l.Reason = by + "it lives only as long as the agent's mount namespace, which cannot be shown to outlive the agent (" + unverifiable(m) + ")"
	default:
		l.Outlives = true
		l.Reason = "not mounted by the agent; whether it outlives the agent's mount namespace cannot be checked: " + unverifiable(m)
	}
	return l
}

func unverifiable(m BPFFSMount) string {
	switch {
	case !m.HostPID1:
		return "in a PID namespace (a container) PID 1 is not the host's init and the host's mounts cannot be seen"
	case !m.PID1Read:
		return "PID 1's mounts cannot be read (/proc hides it: hidepid)"
	}
	return "PID 1's mounts could not be compared"
}

// checkBPFFSLife judges the bpffs holding pin directory pin when the agent
// opens it, and returns *PrivateBPFFSError when it would end with the
// agent; a bpffs this run mounted is unmounted then.
func checkBPFFSLife(pin string, mounted bool) (BPFFSLife, error) {
	dir := filepath.Dir(pin)
	l := judgeBPFFS(readBPFFSMount(dir, procMounts{}), mounted)
	if l.Outlives {
		return l, nil
	}
	if mounted {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
	return l, &PrivateBPFFSError{Pin: pin, Life: l}
}

// LogLife says, once the pin directory is open, where the pins go and
// whether they outlive the agent.
func (d *Dir) LogLife(log *slog.Logger) {
	l := d.life
	msg := "pins outlive the agent"
	if !l.Verified {
		msg = "pins trusted to outlive the agent, unverified"
	}
	log.Info(msg, "bpffs", l.Mount, "dev", l.Dev, "reason", l.Reason)
}

// Outlives checks again, as the agent stops, that the bpffs holding the
// pins outlives it: the host's mount may have been unmounted meanwhile,
// leaving only the agent's copy. Returns the reason when it does not.
func (d *Dir) Outlives() (bool, string) {
	l := judgeBPFFS(readBPFFSMount(filepath.Dir(d.path), procMounts{}), d.life.MountedByAgent)
	if !l.OnBPFFS() {
		return false, describeMount(l.BPFFSMount)
	}
	return l.Outlives, l.Reason
}
