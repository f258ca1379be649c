package fleet

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// newInstance returns a new instance id: 16 hex digits from crypto/rand,
// one per start of a controller (docs/design.md §12, Identity). Two
// processes under one member name, two hosts cloned from one image, hold
// two ids and so two entries, and both are counted.
func newInstance() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	return hex.EncodeToString(b[:])
}

// isInstance says whether s reads as an instance id.
func isInstance(s string) bool {
	if len(s) != 16 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// swapInstance records inst in file as this host's instance and returns
// the one recorded there before ("" when none, or when file is "" or holds
// no id), so that a restarted agent replaces its earlier instance at its
// first report instead of after that entry's ttl. The file is written
// whole (a temporary file renamed over it). Returns an error, with the
// previous id when it was read, when the file cannot be written.
func swapInstance(file, inst string) (string, error) {
	if file == "" {
		return "", nil
	}
	prev := ""
	if b, err := os.ReadFile(file); err == nil && isInstance(strings.TrimSpace(string(b))) {
		prev = strings.TrimSpace(string(b))
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		return prev, fmt.Errorf("fleet instance file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return prev, fmt.Errorf("fleet instance file: %w", err)
	}
	_, err = tmp.WriteString(inst + "\n")
	if e := tmp.Close(); err == nil {
		err = e
	}
	if err == nil {
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return prev, fmt.Errorf("fleet instance file: %w", err)
	}
	return prev, nil
}

// entry is this instance's entry for a report of est under cfg.
func (c *Controller) entry(cfg *Config, est Sums) entry {
	return entry{Member: cfg.Member, Instance: c.inst, Replaces: c.replaces, Est: est, Prev: c.wrote,
		TTL: cfg.TTL, Report: cfg.Report, Window: cfg.Window, Max: cfg.Max, Digest: cfg.Digest}
}

// judge takes what the store saw of this member's name and settings (v):
// the metrics, and one log line when another instance appears under this
// name (ERROR: both are counted, and the fleet's budget is shared by one
// more member than the operator meant) or this member's settings stop
// agreeing with the most members' (WARN), and one when that clears.
func (c *Controller) judge(v view) {
	c.m.conflicts.Store(int64(v.conflicts))
	c.m.groups.Store(int64(v.groups))
	differs := int64(0)
	if v.differs {
		differs = 1
	}
	c.m.differs.Store(differs)
	switch {
	case v.conflicts > 0 && !c.conflicted:
		c.conflicted = true
		c.log.Error("fleet: another agent reports under this member name: both are counted as members; give each its own name (run --fleet-member)",
			"others_under_name", v.conflicts)
	case v.conflicts == 0 && c.conflicted:
		c.conflicted = false
		c.log.Info("fleet: this member name is this agent's alone again")
	}
	cfg := c.cfg.Load()
	switch {
	case v.differs && !c.differed:
		c.differed = true
		c.log.Warn("fleet: this member's window, fleet.max, ttl or tier table differs from the most members': each judges on its own (tierlimit status --fleet names the difference)",
			"window", cfg.Window, "max", cfg.Max, "ttl", cfg.TTL, "digest", cfg.Digest, "groups", v.groups)
	case !v.differs && c.differed:
		c.differed = false
		c.log.Info("fleet: this member's settings agree with the fleet's again")
	}
}
