package fleet_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tierlimit/tierlimit/agent/fleet"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
	"github.com/tierlimit/tierlimit/tiers/storeurl"
)

// overlay is deploy/kubernetes-fleet, the Kubernetes overlay of a fleet.
const overlay = "../../deploy/kubernetes-fleet/"

// overlayData reads the data (or stringData) of the one object of file.
func overlayData(t *testing.T, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(overlay + file)
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		Data       map[string]string `yaml:"data"`
		StringData map[string]string `yaml:"stringData"`
	}
	if err := yaml.Unmarshal(b, &obj); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if obj.Data == nil {
		return obj.StringData
	}
	return obj.Data
}

// TestFleetKubernetesStore runs the Kubernetes overlay's store as it
// starts in its pod (store-config.yaml's start.sh, its ACL from the
// Secret), on redis-server in place of valkey-server, and the overlay's
// policy (which tiers parses whole) against it: members that log in as the
// policy's user with the Secret's member password share; the same user on
// another fleet's keys is refused (ErrAuth, NOPERM); the Secret's
// placeholders keep the store from starting.
func TestFleetKubernetesStore(t *testing.T) {
	server, _ := testenv.RequireRedis(t)
	pol, err := tiers.ParseYAML([]byte(overlayData(t, "policy.yaml")["policy.yaml"]))
	if err != nil {
		t.Fatalf("the overlay's policy: %v", err)
	}
	su, err := storeurl.Parse(pol.Fleet.Store)
	if err != nil || su.Username == "" {
		t.Fatalf("the overlay's fleet.store %q: %v; want an ACL user", pol.Fleet.Store, err)
	}
	conf := overlayData(t, "store-config.yaml")
	secret := overlayData(t, "secret.yaml")

	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	script := write("conf/start.sh", conf["start.sh"])
	write("conf/member.acl", conf["member.acl"])
	start := func(member, admin string) (*exec.Cmd, int) {
		write("secrets/member", member)
		write("secrets/admin", admin)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cmd := exec.Command("sh", script)
		cmd.Env = append(os.Environ(), "FLEET_SECRETS="+dir+"/secrets", "FLEET_STORE_CONF="+dir+"/conf",
			"FLEET_ACL_FILE="+dir+"/users.acl", "FLEET_STORE_SERVER="+server, "FLEET_STORE_PORT="+strconv.Itoa(port))
		cmd.Dir = dir
		return cmd, port
	}

	// The Secret as shipped: the store refuses to start.
	cmd, _ := start(secret["member"], secret["admin"])
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "set the member and admin passwords") {
		t.Errorf("the store started on the Secret's placeholders: %v, %s", err, out)
	}

	cmd, port := start("m3mber-pw\n", "adm1n-pw")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the store does not listen on %s: %s", addr, out.String())
		}
	}
	store := "redis://" + su.Username + "@" + addr + "/0"
	var ms []*member
	for i, est := range []uint64{600, 300, 100} {
		cfg := testConfig(store, pol.Fleet.Name, string(rune('a'+i)))
		cfg.PasswordFile = filepath.Join(dir, "secrets/member")
		ms = append(ms, join(t, cfg, est))
	}
	shares(t, 20, ms...)
	cfg := testConfig(store, pol.Fleet.Name+"-other", "x")
	cfg.PasswordFile = filepath.Join(dir, "secrets/member")
	x := join(t, cfg, 1)
	if got := metric(t, x.c, "tierlimit_fleet_auth_failed"); got != 1 || !strings.Contains(x.log.String(), "NOPERM") {
		t.Errorf("another fleet's keys as the overlay's user: fleet_auth_failed %v, log:\n%s\nwant 1 and NOPERM", got, x.log)
	}
	if _, err := fleet.Status(context.Background(), cfg); !errors.Is(err, fleet.ErrAuth) {
		t.Errorf("Status of another fleet as the overlay's user: %v; want ErrAuth", err)
	}
}
