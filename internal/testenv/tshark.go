package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// RequireTshark skips tb when tshark is not installed, or fails it with
// TIERLIMIT_REQUIRE_BPF=1 (deploy/vagrant/provision.sh installs it).
func RequireTshark(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("tshark"); err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("tshark required (%s=1) but not found: %v", RequireEnv, err)
		}
		tb.Skipf("skipping: no tshark (%v)", err)
	}
}

// TsharkComments reads a pcapng file with tshark and returns each packet's
// comment, one per packet, in order; an error when tshark fails to read it
// (exit status and stderr). Any goroutine may call it.
func TsharkComments(path string) ([]string, error) {
	cmd := exec.Command("tshark", "-n", "-r", path, "-T", "fields", "-e", "frame.comment")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("tshark -r %s: %w: %s", path, err, stderr.String())
	}
	text := strings.TrimSuffix(string(out), "\n")
	if text == "" {
		return nil, nil
	}
	return strings.Split(text, "\n"), nil
}
