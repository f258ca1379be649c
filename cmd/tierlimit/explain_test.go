package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestExplain: the typed errors of agent and tiers get the flag or command
// that fixes them from cmd, and keep their identity (exit codes).
func TestExplain(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{explainAgent(fmt.Errorf("attach xdp to eth9: %w: %w", attach.ErrNativeRefused, fmt.Errorf("operation not supported")), "", []string{"eth9"}), "try --xdp-mode generic"},
		{explainAgent(&agent.IncompatiblePinError{Pin: "/sys/fs/bpf/x", Err: fmt.Errorf("map settings")}, "/sys/fs/bpf/x", []string{"eth9"}), "remove them with tierlimit detach --iface eth9 --pin-path /sys/fs/bpf/x"},
		{explainAgent(&pin.ForeignProgramError{Iface: "eth9"}, "", []string{"eth9"}), "pass --replace"},
		{explainAgent(&pin.BusyError{Iface: "eth9"}, "", []string{"eth9"}), "run with its --pin-path"},
	} {
		if !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%q lacks %q", c.err, c.want)
		}
	}
	if err := explainAgent(&pin.ForeignProgramError{Iface: "eth9", HeldByLink: true}, "", []string{"eth9"}); strings.Contains(err.Error(), "--replace") {
		t.Errorf("--replace advised for a program held by a bpf_link: %q", err)
	}
	kernel := fmt.Errorf("load: %w", &bpf.KernelFeatureError{Feature: "the bpf_loop helper in XDP programs", Since: "5.17", Release: "5.15.0-91-generic", Missing: 1})
	var stderr strings.Builder
	if code := report(&stderr, kernel); code != exitUsage || strings.Count(stderr.String(), "\n") != 1 ||
		!strings.Contains(stderr.String(), "lacks the bpf_loop helper in XDP programs; tierlimit needs Linux 5.17 or later") {
		t.Errorf("a kernel without bpf_loop: exit %d, %q; want exit 2 and one line naming the helper and the version", code, stderr.String())
	}
	code, _, errs := runCmd(t, "check", "--config", writeFile(t, "empty.yaml", "# nothing\n"))
	if code != exitUsage || !strings.Contains(errs, "holds no policy") || !strings.Contains(errs, "'tierlimit check' without --config prints the defaults") {
		t.Errorf("empty config: exit %d, %q", code, errs)
	}
}

// TestRunForeignProgramHint: run on an interface with another XDP program
// says to pass --replace (the agent's error names the program, cmd the
// flag), exit 1, and leaves the program alone.
func TestRunForeignProgramHint(t *testing.T) {
	testenv.Require(t)
	p := runPair(t)
	testenv.AttachForeign(t, p.Coll, p.CollIf, testenv.BareProgram(t, 2))
	id := testenv.XDP(t, p.Coll, p.CollIf).ID
	var line strings.Builder
	var code int
	p.Coll.Do(func() error {
		var sink strings.Builder
		code = report(&line, run(context.Background(), []string{"run", "--iface", p.CollIf, "--no-pin", "--metrics-addr", ""}, &sink, &sink))
		return nil
	})
	if code != exitFailure || !strings.Contains(line.String(), `"bare"`) || !strings.Contains(line.String(), "pass --replace to replace it") {
		t.Errorf("exit %d: %q", code, line.String())
	}
	if got := testenv.XDP(t, p.Coll, p.CollIf).ID; got != id {
		t.Errorf("foreign program %d replaced by %d", id, got)
	}
	p.Coll.Do(func() error {
		l, err := netlink.LinkByName(p.CollIf)
		if err == nil {
			err = netlink.LinkSetXdpFdWithFlags(l, -1, nl.XDP_FLAGS_SKB_MODE)
		}
		return err
	})
}
