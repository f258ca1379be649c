package tiers

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReadFileRefuses: a FIFO (with no writer: a blocking open would hang),
// a directory, a device, a symlink to a FIFO and a file one byte over the
// limit are refused at once with an error naming the path and the reason;
// a file of exactly MaxConfigBytes is read.
func TestReadFileRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink("fifo.yaml", link); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.yaml")
	sized(t, huge, MaxConfigBytes+1)
	for _, c := range []struct {
		path, want string
		sentinel   error
	}{
		{fifo, "a FIFO", ErrNotRegular},
		{link, "a FIFO", ErrNotRegular},
		{dir, "a directory", ErrNotRegular},
		{"/dev/null", "a character device", ErrNotRegular},
		{huge, "the limit is 4194304 bytes (4 MiB)", ErrTooLarge},
	} {
		_, err := ReadFile(c.path)
		if !errors.Is(err, c.sentinel) {
			t.Errorf("ReadFile(%s) = %v, want %v", c.path, err, c.sentinel)
			continue
		}
		var pe *fs.PathError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ReadFile(%s) = %q, want a path error naming %q", c.path, err, c.want)
		}
		if _, lerr := LoadFile(c.path); !errors.Is(lerr, c.sentinel) {
			t.Errorf("LoadFile(%s) = %v, want %v", c.path, lerr, c.sentinel)
		}
	}
	exact := filepath.Join(dir, "exact.yaml")
	sized(t, exact, MaxConfigBytes)
	if data, err := ReadFile(exact); err != nil || len(data) != MaxConfigBytes {
		t.Errorf("ReadFile of exactly the limit: %d bytes, %v", len(data), err)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want fs.ErrNotExist", err)
	}
}

// sized writes a file of n bytes of YAML comment.
func sized(t *testing.T, path string, n int) {
	t.Helper()
	b := []byte(strings.Repeat("#", n))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
