package fleet_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/agent/fleet"
)

// TestStartRefusesStore: Start refuses a store URL that storeurl.Parse
// refuses, wrapping ErrStoreURL, and never repeats a password.
func TestStartRefusesStore(t *testing.T) {
	for _, url := range []string{"10.0.0.5:6379", "http://h", "redis+ring://h", "redis://user:s3cret@h",
		"redis://h1,h2", "redis+sentinel://s1", "redis+cluster://h1/0", "redis://h/x", "redis://h:99999", "redis://", "redis://h?db=1"} {
		cfg := fleet.Config{Name: "f", Member: "m", Store: url, Report: 100e6, TTL: 1e9}
		c, err := fleet.Start(cfg, &kernel{}, &agentSide{}, nil)
		if !errors.Is(err, fleet.ErrStoreURL) {
			t.Errorf("%s: err %v, want ErrStoreURL", url, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", url, err)
		}
		if c != nil {
			c.Close()
		}
	}
}

// TestStartRefusesConfig: what Start refuses before it touches the store.
func TestStartRefusesConfig(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := fleet.Config{Name: "f", Member: "m", Store: "redis://127.0.0.1:1", Report: 100e6, TTL: 1e9}
	for _, tc := range []struct {
		name string
		edit func(*fleet.Config)
		want error
	}{
		{"no name", func(c *fleet.Config) { c.Name = "" }, fleet.ErrConfig},
		{"braces", func(c *fleet.Config) { c.Name = "a}b" }, fleet.ErrConfig},
		{"report >= ttl", func(c *fleet.Config) { c.Report = c.TTL }, fleet.ErrConfig},
		{"fallback", func(c *fleet.Config) { c.Fallback = "drop" }, fleet.ErrConfig},
		{"scheme", func(c *fleet.Config) { c.Store = "memcached://h" }, fleet.ErrStoreURL},
		{"missing password_file", func(c *fleet.Config) { c.PasswordFile = filepath.Join(dir, "none") }, fleet.ErrPasswordFile},
		{"empty password_file", func(c *fleet.Config) { c.PasswordFile = empty }, fleet.ErrPasswordFile},
		{"ca_file without tls", func(c *fleet.Config) { c.CAFile = empty }, fleet.ErrCAFile},
		{"ca_file not PEM", func(c *fleet.Config) { c.Store = "rediss://127.0.0.1:1"; c.CAFile = empty }, fleet.ErrCAFile},
		{"cert_file without key_file", func(c *fleet.Config) { c.Store = "rediss://127.0.0.1:1"; c.CertFile = empty }, fleet.ErrCertFile},
		{"cert_file without tls", func(c *fleet.Config) { c.CertFile, c.KeyFile = empty, empty }, fleet.ErrCertFile},
		{"cert_file not PEM", func(c *fleet.Config) { c.Store = "rediss://127.0.0.1:1"; c.CertFile, c.KeyFile = empty, empty }, fleet.ErrCertFile},
		{"server_name without tls", func(c *fleet.Config) { c.ServerName = "redis.example.com" }, fleet.ErrConfig},
		{"sentinel_password_file without sentinel", func(c *fleet.Config) { c.SentinelPasswordFile = empty }, fleet.ErrSentinelPasswordFile},
		{"sentinel_password_file empty", func(c *fleet.Config) { c.Store = "redis+sentinel://127.0.0.1:1/m"; c.SentinelPasswordFile = empty }, fleet.ErrSentinelPasswordFile},
		{"sentinel_password_file missing", func(c *fleet.Config) {
			c.Store = "redis+sentinel://127.0.0.1:1/m"
			c.SentinelPasswordFile = filepath.Join(dir, "none")
		}, fleet.ErrSentinelPasswordFile},
	} {
		cfg := base
		tc.edit(&cfg)
		c, err := fleet.Start(cfg, &kernel{}, &agentSide{}, nil)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		if c != nil {
			c.Close()
		}
	}
}
