package attach

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeNet makes a /sys/class/net look-alike with one interface of driver.
func fakeNet(t *testing.T, iface, driver, mtu string) string {
	t.Helper()
	dir := t.TempDir()
	dev := filepath.Join(dir, iface, "device")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "drivers", driver), filepath.Join(dev, "driver")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, iface, "mtu"), []byte(mtu+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestNativeHint(t *testing.T) {
	for _, tc := range []struct {
		name, driver string
		err          error
		want         string // a substring; "" means no hint
	}{
		{"virtio mtu", "virtio_net", unix.EINVAL, "ip link set dev eth1 mtu 1500"},
		{"virtio offloads", "virtio_net", unix.EOPNOTSUPP, "ctrl_guest_offloads"},
		{"virtio queues", "virtio_net", unix.ENOMEM, "ethtool -L eth1 combined N"},
		{"virtio other errno", "virtio_net", unix.EPERM, ""},
		{"other driver", "e1000", unix.EINVAL, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fakeNet(t, "eth1", tc.driver, "9000")
			got := nativeHint(dir, "eth1", errors.Join(errors.New("attach"), tc.err))
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("nativeHint = %q, want it to contain %q", got, tc.want)
			}
			if tc.want != "" && tc.err == unix.EINVAL && !strings.Contains(got, "MTU 9000") {
				t.Fatalf("nativeHint = %q, want the interface's MTU", got)
			}
		})
	}
	if got := nativeHint(t.TempDir(), "nosuch", unix.EINVAL); got != "" {
		t.Fatalf("nativeHint for a missing interface = %q, want none", got)
	}
}
