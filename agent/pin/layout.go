package pin

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tierlimit/tierlimit/bpf"
)

// The pin directory records the layout of its maps (bpf.Layout) and the
// version of the binary that wrote it (DESIGN.md §11), as the target of a
// symlink, <pin>/layout -> "<layout> <version>": bpffs holds no regular
// files, and a symlink is written whole by a rename. A directory without
// the record was pinned before layouts were recorded: layout 0.

// Layout is the layout record of a pin directory.
type Layout struct {
	// Version is the layout (bpf.Layout of the binary that wrote it).
	Version int `json:"version"`
	// WrittenBy is that binary's version; empty when unrecorded.
	WrittenBy string `json:"written_by,omitempty"`
	// Recorded is false for a directory pinned before layouts were
	// recorded (Version 0).
	Recorded bool `json:"recorded"`
}

func (l Layout) String() string {
	if !l.Recorded {
		return "0 (unrecorded: pinned before tierlimit recorded its layout)"
	}
	if l.WrittenBy == "" {
		return strconv.Itoa(l.Version)
	}
	return fmt.Sprintf("%d (written by tierlimit %s)", l.Version, l.WrittenBy)
}

const layoutName = "layout"

// readLayout reads the layout record of pin directory dir.
func readLayout(dir string) (Layout, error) {
	target, err := os.Readlink(filepath.Join(dir, layoutName))
	if errors.Is(err, os.ErrNotExist) {
		return Layout{}, nil
	}
	if err != nil {
		return Layout{}, fmt.Errorf("read layout record: %w", err)
	}
	num, by, _ := strings.Cut(target, " ")
	v, err := strconv.Atoi(num)
	if err != nil || v < 0 {
		return Layout{}, fmt.Errorf("layout record %s: %q is no layout", filepath.Join(dir, layoutName), target)
	}
	return Layout{Version: v, WrittenBy: by, Recorded: true}, nil
}

// WriteLayout records this binary's layout and version in dir, replacing
// the record there in one rename.
func WriteLayout(dir, version string) error {
	if version == "" {
		version = "unknown"
	}
	tmp := filepath.Join(dir, layoutName+"-new")
	_ = os.Remove(tmp)
	if err := os.Symlink(fmt.Sprintf("%d %s", bpf.Layout, version), tmp); err != nil {
		return fmt.Errorf("write layout record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, layoutName)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write layout record: %w", err)
	}
	return nil
}

// CheckLayout reads dir's layout record and refuses a layout newer than
// this binary's (*NewerLayoutError).
func CheckLayout(dir string) (Layout, error) {
	l, err := readLayout(dir)
	if err != nil {
		return l, err
	}
	if l.Version > bpf.Layout {
		return l, &NewerLayoutError{Pin: dir, Found: l}
	}
	return l, nil
}

// hasPinnedMaps reports whether dir (a maps directory) holds anything.
func hasPinnedMaps(dir string) bool {
	entries, err := os.ReadDir(dir)
	return err == nil && len(entries) > 0
}

// Migrate is what Open found to carry into this layout's maps: the
// pinned maps of an older layout, or of one whose specs differ.
type Migrate struct {
	From Layout
	Why  error
}

// StartMigration carries the old layout's state into lim's maps, loaded
// without pins and with the policy applied: before the links run them.
func (d *Dir) StartMigration(lim *bpf.Limiter) (*bpf.Migration, error) {
	mg, err := lim.Migrate(d.Maps(), d.Migrate.From.Version)
	if err != nil {
		return nil, fmt.Errorf("migrate pinned state of layout %d: %w", d.Migrate.From.Version, err)
	}
	return mg, nil
}

// FinishMigration runs once every link runs lim's program: it adds what
// the old program counted meanwhile, pins lim's maps in place of the old
// ones and logs what was carried and what was reset. It closes mg.
func (d *Dir) FinishMigration(lim *bpf.Limiter, mg *bpf.Migration, log *slog.Logger) error {
	defer mg.Close()
	if err := mg.Finish(lim); err != nil {
		return err
	}
	if err := lim.PinAt(d.Maps(), filepath.Join(d.path, "maps-new")); err != nil {
		return fmt.Errorf("pin migrated maps: %w", err)
	}
	log.Info("migrated pinned state to this version's layout, program replaced in place",
		"pin", d.path, "from_layout", d.Migrate.From.String(), "to_layout", bpf.Layout,
		"reason", d.Migrate.Why, "carried", strings.Join(mg.Carried.Carried, ", "),
		"reset", strings.Join(mg.Reset, ", "))
	return nil
}
