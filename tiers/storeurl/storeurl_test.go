package storeurl

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want URL
	}{
		{"redis://10.0.0.5", URL{Scheme: SchemeRedis, Addrs: []string{"10.0.0.5:6379"}}},
		{"redis://10.0.0.5:6380/3", URL{Scheme: SchemeRedis, Addrs: []string{"10.0.0.5:6380"}, DB: 3}},
		{"rediss://tl@store.example:6390", URL{Scheme: SchemeRedisTLS, Addrs: []string{"store.example:6390"}, Username: "tl"}},
		{"redis://[2001:db8::1]/0", URL{Scheme: SchemeRedis, Addrs: []string{"[2001:db8::1]:6379"}}},
		{"redis://[2001:db8::1]:7000", URL{Scheme: SchemeRedis, Addrs: []string{"[2001:db8::1]:7000"}}},
		{"redis+sentinel://s1,s2:26380/mymaster/2", URL{Scheme: SchemeSentinel, Addrs: []string{"s1:26379", "s2:26380"}, Master: "mymaster", DB: 2}},
		{"redis+cluster://h1,h2:7001,h3", URL{Scheme: SchemeCluster, Addrs: []string{"h1:6379", "h2:7001", "h3:6379"}}},
		{"rediss+sentinel://s1/m", URL{Scheme: SchemeSentinelTLS, Addrs: []string{"s1:26379"}, Master: "m"}},
		{"rediss+cluster://h1,h2", URL{Scheme: SchemeClusterTLS, Addrs: []string{"h1:6379", "h2:6379"}}},
	} {
		got, err := Parse(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	if _, err := Parse("redis://user:hunter2@h"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a password in the URL: %v", err)
	}
}

func TestReadPassword(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/secret"
	if err := os.WriteFile(path, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pw, err := ReadPassword(path, os.ReadFile); err != nil || pw != "s3cret" {
		t.Errorf("ReadPassword = %q, %v", pw, err)
	}
	for _, bad := range []string{dir + "/none", dir} {
		if _, err := ReadPassword(bad, os.ReadFile); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if err := os.WriteFile(path, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPassword(path, os.ReadFile); !errors.Is(err, ErrEmptyPassword) {
		t.Errorf("an empty password file: %v, want ErrEmptyPassword", err)
	}
}

// TestRedact: a store URL shows its scheme and hosts, never a user, a
// path or a password, even one the grammar refuses.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://10.0.0.5/0":                 "redis://10.0.0.5:6379",
		"rediss://tl@store.example:6390":     "rediss://store.example:6390",
		"redis+sentinel://u@s1,s2:26380/m/2": "redis+sentinel://s1:26379,s2:26380",
		"redis://user:hunter2@h":             "(the fleet.store URL)",
		"redis://u:pa/ss@h":                  "(the fleet.store URL)",
		"memcached://h":                      "(the fleet.store URL)",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
