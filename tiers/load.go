package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// MaxConfigBytes is the largest policy file ReadFile and LoadFile accept:
// 4 MiB. The largest policy the maps can hold (MaxSelectRules rules, the
// prefix limits) takes well under 1 MiB of YAML.
const MaxConfigBytes = 4 << 20

var (
	// ErrNotRegular is returned by ReadFile and LoadFile for a path that is
	// not a regular file once symlinks are followed: a directory, a FIFO, a
	// socket or a device. Reading one could block for ever or never end.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge is returned by ReadFile and LoadFile for a file over
	// MaxConfigBytes.
	ErrTooLarge = errors.New("config file too large")
)

// ReadFile reads the policy file at path, following symlinks. It never
// blocks on a FIFO and never reads more than MaxConfigBytes: it opens the
// file with O_NONBLOCK, checks with fstat that the open file is a regular
// file, and reads at most MaxConfigBytes+1 bytes.
//
// Returns an *fs.PathError: wrapping ErrNotRegular for a file that is not
// regular, ErrTooLarge for one over MaxConfigBytes (both reachable with
// errors.Is), or the system's error (fs.ErrNotExist, fs.ErrPermission, ...)
// for a file that cannot be opened or read.
func ReadFile(path string) ([]byte, error) {
	// Refuse what stat already shows to be no regular file before opening
	// it: opening some devices has side effects.
	if fi, err := os.Stat(path); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// The path may have been swapped between stat and open: check the file
	// that is open.
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	if fi.Size() > MaxConfigBytes {
		return nil, tooLarge(path, fi.Size())
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if len(data) > MaxConfigBytes { // grew while read
		return nil, tooLarge(path, int64(len(data)))
	}
	return data, nil
}

func notRegular(path string, m fs.FileMode) error {
	return &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%s)", ErrNotRegular, fileKind(m))}
}

func tooLarge(path string, size int64) error {
	return &fs.PathError{Op: "read", Path: path,
		Err: fmt.Errorf("%w: %d bytes, the limit is %d bytes (%d MiB)", ErrTooLarge, size, MaxConfigBytes, MaxConfigBytes>>20)}
}

// fileKind names the type of a file mode for an error message.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "type " + m.Type().String()
}

// LoadFile reads the policy file at path with ReadFile and parses it with
// Parse. An error names the path; a *ConfigError within it is reachable
// with errors.As and its sentinel with errors.Is. Returns the errors of
// ReadFile for a file that cannot be read.
func LoadFile(path string) (Policy, error) {
	data, err := ReadFile(path)
	if err != nil {
		return Policy{}, err
	}
	return Parse(path, data)
}

// Parse parses data, the content of the policy file named name:
// ParseProperties when the name ends in ".properties" (any case), ParseYAML
// otherwise. An error names the file; a *ConfigError within it is reachable
// with errors.As and its sentinel with errors.Is.
func Parse(name string, data []byte) (Policy, error) {
	parse := ParseYAML
	isProps := strings.EqualFold(filepath.Ext(name), ".properties")
	if isProps {
		parse = ParseProperties
	}
	p, err := parse(data)
	if err != nil {
		// A seed-style file under another name fails as YAML: say why.
		if !isProps && bytes.Contains(data, []byte("limiter.")) {
			if _, perr := ParseProperties(data); perr == nil {
				return Policy{}, fmt.Errorf("%s: %w (this is the seed's .properties format: name the file *.properties)", name, err)
			}
		}
		return Policy{}, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}
