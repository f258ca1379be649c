package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

// hinted is an error with what the user can do about it: the flags and
// commands that agent and tiers leave to the command.
type hinted struct {
	err  error
	hint string
}

func (h hinted) Error() string { return h.err.Error() + " (" + h.hint + ")" }
func (h hinted) Unwrap() error { return h.err }

// explain adds to err the hint for a typed error of tiers that reads the
// same from every command; err otherwise. main applies it to every error.
func explain(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, tiers.ErrEmptyConfig):
		return hinted{err, "'tierlimit check' without --config prints the defaults"}
	case errors.Is(err, bpf.ErrKernelFeature): // exit 2: only another kernel helps
		return hostError{err}
	}
	return err
}

// explainAgent words an agent error for the person at the command line:
// which flag to pass, which command to run. The agent returns typed errors
// and names no flags; only cmd knows them. err stays in the chain.
func explainAgent(err error, pinPath string, ifaces []string) error {
	if err == nil {
		return nil
	}
	detach := "tierlimit detach --iface " + strings.Join(ifaces, ",")
	if len(ifaces) != 1 {
		detach = "tierlimit detach --iface IF"
	}
	if pinPath != "" && pinPath != agent.DefaultPinPath {
		detach += " --pin-path " + pinPath
	}
	var (
		foreign  *pin.ForeignProgramError
		busy     *pin.BusyError
		running  *pin.AgentRunningError
		incompat *agent.IncompatiblePinError
	)
	if e := explainLayout(err, detach); e != nil {
		return e
	}
	switch {
	case errors.As(err, &foreign) && !foreign.HeldByLink:
		return hinted{err, "pass --replace to replace it"}
	case errors.As(err, &busy):
		return fmt.Errorf("%w: stop the agent that holds it, or run with its --pin-path, or remove it with tierlimit detach --iface %s --pin-path P", err, busy.Iface)
	case errors.As(err, &running):
		return fmt.Errorf("%w: stop it first", err)
	case errors.As(err, &incompat):
		return hinted{err, "remove them with " + detach}
	case errors.Is(err, attach.ErrNativeRefused):
		return hinted{err, "try --xdp-mode generic, or auto to fall back"}
	case errors.Is(err, attach.ErrNotEthernet): // exit 2: another --iface
		return usageError{fmt.Errorf("--iface: %w", err)}
	case errors.Is(err, attach.ErrDuplicateInterface):
		return usageError{fmt.Errorf("--iface: %w", err)}
	case errors.Is(err, agent.ErrBPFDenied): // exit 2: how run was started must change
		return usageError{err}
	case errors.Is(err, pin.ErrPrivateBPFFS): // exit 2: how run was started must change
		return usageError{hinted{err, privateBPFFSHint}}
	case errors.Is(err, pin.ErrPinPath):
		return fmt.Errorf("--pin-path: %w", err)
	}
	return err
}

// explainLayout words a pinned state of a newer layout (exit 2: this
// binary must not run on it), nil for any other error.
func explainLayout(err error, detach string) error {
	if !errors.Is(err, pin.ErrNewerLayout) {
		return nil
	}
	return usageError{hinted{err, "run that version or a newer one; or remove the limiter with " + detach +
		" (the interfaces go unprotected until an agent attaches again)"}}
}
