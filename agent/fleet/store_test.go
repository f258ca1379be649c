package fleet_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/agent/fleet"
)

func TestParseStore(t *testing.T) {
	for _, tc := range []struct {
		url    string
		kind   string
		tls    bool
		user   string
		addrs  []string
		master string
		db     int
	}{
		{url: "redis://10.0.0.5:6379/0", kind: "redis", addrs: []string{"10.0.0.5:6379"}},
		{url: "redis://store", kind: "redis", addrs: []string{"store:6379"}},
		{url: "redis://store/3", kind: "redis", addrs: []string{"store:6379"}, db: 3},
		{url: "rediss://tl@store:6380/", kind: "redis", tls: true, user: "tl", addrs: []string{"store:6380"}},
		{url: "redis://[::1]:7000", kind: "redis", addrs: []string{"[::1]:7000"}},
		{url: "redis+sentinel://s1,s2:26380/mymaster", kind: "sentinel", addrs: []string{"s1:26379", "s2:26380"}, master: "mymaster"},
		{url: "redis+sentinel://s1/mymaster/2", kind: "sentinel", addrs: []string{"s1:26379"}, master: "mymaster", db: 2},
		{url: "redis+cluster://h1,h2:7001,h3", kind: "cluster", addrs: []string{"h1:6379", "h2:7001", "h3:6379"}},
		{url: "rediss+cluster://u@h1:7000", kind: "cluster", tls: true, user: "u", addrs: []string{"h1:7000"}},
	} {
		kind, tls, user, addrs, master, db, err := fleet.ParseStore(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if kind != tc.kind || tls != tc.tls || user != tc.user || !reflect.DeepEqual(addrs, tc.addrs) || master != tc.master || db != tc.db {
			t.Errorf("%s: got kind %s tls %v user %q addrs %v master %q db %d; want %s %v %q %v %q %d",
				tc.url, kind, tls, user, addrs, master, db, tc.kind, tc.tls, tc.user, tc.addrs, tc.master, tc.db)
		}
	}
}

func TestParseStoreRefuses(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"10.0.0.5:6379", "no scheme"},
		{"http://h", "unknown scheme"},
		{"redis+ring://h", "unknown scheme"},
		{"redis://user:s3cret@h", "password_file"},
		{"redis://h1,h2", "redis+sentinel:// or redis+cluster://"},
		{"redis+sentinel://s1", "names the master"},
		{"redis+cluster://h1/0", "unexpected path"},
		{"redis://h/x", "not a number"},
		{"redis://h:99999", "bad port"},
		{"redis://", "empty host"},
		{"redis://h?db=1", "query"},
	} {
		_, _, _, _, _, _, err := fleet.ParseStore(tc.url)
		if !errors.Is(err, fleet.ErrStoreURL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want ErrStoreURL saying %q", tc.url, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", tc.url, err)
		}
	}
}

// TestStartRefusesConfig: what Start refuses before it touches the store.
func TestStartRefusesConfig(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
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
