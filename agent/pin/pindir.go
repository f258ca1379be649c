// Package pin is the agent's pinned state (docs/design.md §11): the bpffs
// directory an agent pins its maps, links and program into (Dir), its
// locks, the layout record, the check that the bpffs outlives the agent,
// and reading (Read) or removing (Detach, DetachAll) what is pinned with
// no agent running. It knows nothing of the agent. Linux only.
package pin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
)

// Dir is the bpffs directory an agent (or Detach) pins into, held while
// it runs. Two locks guard it: the lock file under LockDir named after the
// canonical path, which exists before the directory does, and a flock on
// the directory itself, which no cleanup of /run can remove. Layout:
//
//	<pin>/maps/<map>       the limiter's maps (bpf.Options.PinPath)
//	<pin>/links/<iface>    one bpf_link per interface, name encoded (PinName)
//	<pin>/program          the program the links run: how ownership is
//	                       checked without CAP_SYS_ADMIN
type Dir struct {
	path     string // canonical
	runLock  *os.File
	dirLock  *os.File
	dev, ino uint64 // identity of the locked directory
	created  bool   // made by this run: New removes it on failure
	life     BPFFSLife
	// Migrate is set when the pinned maps are of an older layout, or
	// their specs differ from this version's: New carries them over.
	Migrate *Migrate
}

// Path is the canonical pin path.
func (d *Dir) Path() string { return d.path }

// Open locks the pin path pin, mounts bpffs on /sys/fs/bpf when it is
// missing there, makes the directory if needed, and checks that the maps
// pinned there fit this version before anything is written: when they do
// not (an older layout, or specs that differ), migrate says so. Returns
// ErrPinPath, *AgentRunningError, *NewerLayoutError or *PrivateBPFFSError
// (bpffs.go).
func Open(pin string) (_ *Dir, err error) {
	path, err := CanonicalPinPath(pin)
	if err != nil {
		return nil, err
	}
	if strings.Contains(filepath.Base(path), ".") {
		return nil, fmt.Errorf("%w %s: bpffs refuses names with a dot", ErrPinPath, pin)
	}
	d := &Dir{path: path}
	if d.runLock, err = lockRunFile(path); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.Release(true)
		}
	}()
	mounted, err := ensureBPFFS(path)
	if err != nil {
		return nil, err
	}
	if d.life, err = checkBPFFSLife(path, mounted); err != nil {
		return nil, err
	}
	if err := d.lockDir(true); err != nil {
		return nil, err
	}
	found, err := CheckLayout(path)
	if err != nil {
		return nil, err
	}
	if hasPinnedMaps(d.Maps()) {
		if err := bpf.CheckLayout(d.Maps(), found.Version); err != nil {
			d.Migrate = &Migrate{From: found, Why: err}
		}
	}
	return d, d.MakeSubdirs()
}

// lockDir flocks the pin directory, making it first when create is set.
// A directory that does not exist and may not be made is no error.
func (d *Dir) lockDir(create bool) error {
	made := false
	if create {
		if err := os.Mkdir(d.path, 0o700); err == nil {
			made = true
		} else if !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make pin dir %s: %w", d.path, err)
		}
	}
	f, err := os.Open(d.path)
	if errors.Is(err, os.ErrNotExist) && !create {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pin dir %s: %w", d.path, err)
	}
	if err := flockNB(f); err != nil {
		pid := holderPid(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return &AgentRunningError{Pin: d.path, Pid: pid}
		}
		return fmt.Errorf("lock pin dir %s: %w", d.path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return fmt.Errorf("stat pin dir %s: %w", d.path, err)
	}
	// Only now is the directory ours to remove on failure: one that
	// someone else locked first is never removed.
	d.dirLock, d.dev, d.ino, d.created = f, st.Dev, st.Ino, made
	return nil
}

func (d *Dir) MakeSubdirs() error {
	for _, sub := range []string{d.Maps(), d.Links()} {
		if err := os.MkdirAll(sub, 0o700); err != nil {
			return fmt.Errorf("make pin dir: %w", err)
		}
	}
	return nil
}

func (d *Dir) Maps() string    { return filepath.Join(d.path, "maps") }
func (d *Dir) Links() string   { return filepath.Join(d.path, "links") }
func (d *Dir) Program() string { return filepath.Join(d.path, "program") }

// Jump is where the program's judgement's program array is pinned
// (PinProgram).
func (d *Dir) Jump() string { return filepath.Join(d.path, "program_jump") }

// Globals is where the program's globals map (bpf.Limiter.Globals, its
// .bss: the source sketch) is pinned (PinProgram), for the agent of a
// restart to adopt the sketch from.
func (d *Dir) Globals() string { return filepath.Join(d.path, "program_globals") }

// LinkPin is where the link of interface iface is pinned.
func (d *Dir) LinkPin(iface string) string { return filepath.Join(d.Links(), PinName(iface)) }

// Intact reports whether the directory at the pin path is still the one
// this run locked.
func (d *Dir) Intact() bool {
	var st unix.Stat_t
	return unix.Stat(d.path, &st) == nil && st.Dev == d.dev && st.Ino == d.ino
}

// Relock locks the directory at the pin path again after the locked one
// was removed, making it anew.
func (d *Dir) Relock() error {
	if d.dirLock != nil {
		d.dirLock.Close()
		d.dirLock = nil
	}
	if err := d.lockDir(true); err != nil {
		return err
	}
	d.created = false
	return d.MakeSubdirs()
}

// PinProgram pins prog at <pin>/program and its judgement's program array
// jump (bpf.Limiter.JumpTable) at <pin>/program_jump, replacing earlier
// ones. The pin keeps the array filled once the agent's file descriptors
// close (the kernel empties a program array when its last holder closes
// it, kernel/bpf/arraymap.c prog_array_map_clear), so that the program
// left attached goes on tail-calling its judgement; replacing it empties
// the array of the program before, which by then no link of this run
// runs (a link of another run falls back to the call of the judgement:
// docs/design.md §2). globals (bpf.Limiter.Globals), when not nil, is
// pinned at <pin>/program_globals: nothing runs from it; the agent of a
// restart reads the source sketch from it (bpf.Limiter.AdoptSketch).
func (d *Dir) PinProgram(prog *ebpf.Program, jump, globals *ebpf.Map) error {
	if err := repin(prog, d.Program()); err != nil {
		return fmt.Errorf("pin program: %w", err)
	}
	if err := repin(jump, d.Jump()); err != nil {
		return fmt.Errorf("pin the program's jump table: %w", err)
	}
	if globals != nil {
		if err := repin(globals, d.Globals()); err != nil {
			return fmt.Errorf("pin the program's globals: %w", err)
		}
	}
	return nil
}

// repin pins o at path, replacing what is there. It unpins o first: Pin to
// the path o was pinned at is a no-op, even when the file is gone.
func repin(o interface {
	Pin(string) error
	Unpin() error
}, path string) error {
	if err := o.Unpin(); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return o.Pin(path)
}

// Release drops both locks. After a failed New (failed) it removes the
// directory when this run made it.
func (d *Dir) Release(failed bool) {
	if d == nil {
		return
	}
	if failed && d.created {
		os.RemoveAll(d.path)
	}
	if d.dirLock != nil {
		d.dirLock.Close()
	}
	if d.runLock != nil {
		d.runLock.Close() // closing the last fd releases the flock
	}
}

// PinName is the bpffs file name of interface iface's link. bpffs refuses
// names with a dot (eth0.100, a VLAN sub-interface), so '.' is written
// "%2E" and '%' itself "%25"; every other byte an interface name may hold
// is kept. UnpinName reverses it.
func PinName(iface string) string {
	return strings.NewReplacer("%", "%25", ".", "%2E").Replace(iface)
}

// UnpinName is the interface name of link pin file name.
func UnpinName(name string) string {
	return strings.NewReplacer("%2E", ".", "%25", "%").Replace(name)
}

// ensureBPFFS makes sure the pin path's parent is on a bpffs, mounting
// one on /sys/fs/bpf when it is missing there, and reports whether it did.
func ensureBPFFS(pin string) (mounted bool, _ error) {
	parent := filepath.Dir(pin)
	if isBPFFS(parent) {
		return false, nil
	}
	if parent != "/sys/fs/bpf" {
		return false, fmt.Errorf("%w %s: %s is not a bpffs mount", ErrPinPath, pin, parent)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return false, fmt.Errorf("mount bpffs: %w", err)
	}
	if err := unix.Mount("bpf", parent, "bpf", 0, "mode=0700"); err != nil {
		return false, fmt.Errorf("%s is not a bpffs mount and mounting one failed: %w (mount it with: mount -t bpf bpf /sys/fs/bpf)", parent, err)
	}
	return true, nil
}

func isBPFFS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}
