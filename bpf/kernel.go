package bpf

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// KernelTick returns the kernel's tick in ns, measured (MeasureTick).
func KernelTick() (uint64, error) {
	t, err := MeasureTick()
	return t.Ns, err
}

// configPaths are the kernel configs to read CONFIG_HZ from, in order.
func configPaths() []string {
	var uts unix.Utsname
	var paths = []string{"/proc/config.gz"}
	if err := unix.Uname(&uts); err == nil {
		paths = append(paths, "/boot/config-"+unix.ByteSliceToString(uts.Release[:]))
	}
	return paths
}

func configHZ(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return 0, err
		}
		defer gz.Close()
		r = gz
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CONFIG_HZ="); ok {
			hz, err := strconv.ParseUint(v, 10, 32)
			if err != nil || hz == 0 || hz > 10_000 {
				return 0, fmt.Errorf("%s: CONFIG_HZ=%q", path, v)
			}
			return hz, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no CONFIG_HZ", path)
}

// ObjectHash is the SHA-256 of the embedded BPF object, as "sha256:<hex>":
// it names the exact program a binary loads.
func ObjectHash() string {
	sum := sha256.Sum256(_LimiterBytes)
	return "sha256:" + hex.EncodeToString(sum[:])
}
