package fleet_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// secretVolume is a directory laid out as the kubelet lays out a Secret's
// volume: the file is a symlink through ..data, itself a symlink to a
// timestamped directory; an update writes a new directory and renames a
// new ..data over the old one (one atomic rename), then removes the old
// directory.
type secretVolume struct {
	dir string
	gen int
}

func newSecretVolume(t *testing.T, content string) *secretVolume {
	t.Helper()
	return newSecretFiles(t, map[string][]byte{"password": []byte(content + "\n")})
}

// newSecretFiles is a Secret volume holding files (name -> content).
func newSecretFiles(t *testing.T, files map[string][]byte) *secretVolume {
	t.Helper()
	v := &secretVolume{dir: t.TempDir()}
	v.updateFiles(t, files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// file is the path a member reads: DIR/password.
func (v *secretVolume) file() string { return filepath.Join(v.dir, "password") }

// path is the path a member reads for the volume's file name.
func (v *secretVolume) path(name string) string { return filepath.Join(v.dir, name) }

// update swaps the password in as the kubelet does.
func (v *secretVolume) update(t *testing.T, content string) {
	t.Helper()
	v.updateFiles(t, map[string][]byte{"password": []byte(content + "\n")})
}

// updateFiles swaps every file in at once, as the kubelet does.
func (v *secretVolume) updateFiles(t *testing.T, files map[string][]byte) {
	t.Helper()
	v.gen++
	ts := fmt.Sprintf("..2026_12_02_15_00_%02d.%d", v.gen, v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(v.dir, ts, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		os.RemoveAll(filepath.Join(v.dir, old))
	}
}

// reportsUntil returns how many reports m made until cond held (at most
// n reports of time), and whether it held.
func reportsUntil(m *member, n int, cond func() bool) (int, bool) {
	est0, _ := m.k.calls()
	ok := waitFor(n, cond)
	est1, _ := m.k.calls()
	return est1 - est0, ok
}

// TestFleetRotation (issue 40, item 6): the store's password rotates
// (CONFIG SET requirepass, the connections dropped) and the file with it
// as a Secret volume does (an atomic symlink swap), in either order: the
// member rejoins within 2 reports of both being changed, with no reload
// (no SIGHUP). A member started while the store refuses its password
// starts in fallback (fleet_auth_failed 1), keeps retrying at a bounded
// rate, and joins within 2 reports of its file being right.
func TestFleetRotation(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: "pw-1"})
	admin := redis.NewClient(&redis.Options{Addr: r.Addrs[0], Password: "pw-1"})
	defer admin.Close()
	ctx := context.Background()
	setPassword := func(pw string) {
		t.Helper()
		if err := admin.ConfigSet(ctx, "requirepass", pw).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
			t.Fatal(err)
		}
	}
	vol := newSecretVolume(t, "pw-1")
	cfg := testConfig(r.URL(), "rot", "a")
	cfg.PasswordFile = vol.file()
	a := join(t, cfg, 100)
	b := join(t, cfg2(cfg, "b"), 300)
	shares(t, 20, a, b)
	up := func(m *member) func() bool {
		return func() bool {
			return metric(t, m.c, "tierlimit_fleet_store_up") == 1 && metric(t, m.c, "tierlimit_fleet_auth_failed") == 0
		}
	}

	// The store first: refused until the file follows.
	setPassword("pw-2")
	if !waitFor(20, func() bool { return metric(t, a.c, "tierlimit_fleet_auth_failed") == 1 }) {
		t.Fatalf("the store's new password is not refused:\n%s", a.log)
	}
	vol.update(t, "pw-2")
	if n, ok := reportsUntil(a, 20, up(a)); !ok || n > 2 {
		t.Errorf("store then file: a rejoined after %d reports (%v); want within 2:\n%s", n, ok, a.log)
	}

	// The file first: the connection up stays up; the store follows.
	vol.update(t, "pw-3")
	setPassword("pw-3")
	if n, ok := reportsUntil(a, 20, up(a)); !ok || n > 2 {
		t.Errorf("file then store: a rejoined after %d reports (%v); want within 2:\n%s", n, ok, a.log)
	}
	shares(t, 20, a, b)

	// A member that starts while the store refuses it.
	late := newSecretVolume(t, "pw-old")
	cfg = testConfig(r.URL(), "rot", "c")
	cfg.PasswordFile = late.file()
	c := join(t, cfg, 50)
	refusedAndWaiting(t, c, 20, "started refused")
	d0 := metric(t, c.c, "tierlimit_fleet_store_dials_total")
	waitFor(20, func() bool { return false }) // 2 s refused
	dials := metric(t, c.c, "tierlimit_fleet_store_dials_total") - d0
	t.Logf("connections while refused: %v in 2 s", dials)
	if dials > 5 {
		t.Errorf("%v connections in 2 s while refused; want at most 5 (backoff)", dials)
	}
	late.update(t, "pw-3")
	if n, ok := reportsUntil(c, 20, up(c)); !ok || n > 2 {
		t.Errorf("started refused: c joined after %d reports (%v) of its file being right; want within 2:\n%s", n, ok, c.log)
	}
	shares(t, 20, a, b, c)
}

// cfg2 is cfg for another member.
func cfg2(cfg fleetConfig, member string) fleetConfig {
	cfg.Member = member
	return cfg
}

// TestFleetCertificateRotation (issue 40, item 6): a member whose client
// certificate the store refuses (signed by another CA) starts in fallback
// with fleet_auth_failed 1, and joins within 2 reports of cert_file and
// key_file being swapped for good ones as a Secret volume swaps them, with
// no reload.
func TestFleetCertificateRotation(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{TLS: true, ClientAuth: true})
	other := testenv.StartRedis(t, testenv.RedisOptions{TLS: true, ClientAuth: true}) // another CA
	read := func(f string) []byte {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	vol := newSecretFiles(t, map[string][]byte{"tls.crt": read(other.ClientCert), "tls.key": read(other.ClientKey)})
	cfg := testConfig(r.URL(), "certrot", "a")
	cfg.CAFile, cfg.CertFile, cfg.KeyFile = r.CAFile, vol.path("tls.crt"), vol.path("tls.key")
	a := join(t, cfg, 100)
	refusedAndWaiting(t, a, 20, "a certificate of another CA")
	vol.updateFiles(t, map[string][]byte{"tls.crt": read(r.ClientCert), "tls.key": read(r.ClientKey)})
	if n, ok := reportsUntil(a, 20, func() bool {
		return metric(t, a.c, "tierlimit_fleet_store_up") == 1 && metric(t, a.c, "tierlimit_fleet_auth_failed") == 0
	}); !ok || n > 2 {
		t.Errorf("a joined after %d reports (%v) of its certificate being swapped; want within 2:\n%s", n, ok, a.log)
	}
}
