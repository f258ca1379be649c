package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tierlimit/tierlimit/agent"
)

// explain words an agent error for the person at the command line: which
// flag to pass, which command to run. The agent returns typed errors and
// names no flags; only cmd knows them. err stays in the chain.
func explain(err error, pin string, ifaces []string) error {
	if err == nil {
		return nil
	}
	detach := "tierlimit detach --iface " + strings.Join(ifaces, ",")
	if len(ifaces) != 1 {
		detach = "tierlimit detach --iface IF"
	}
	if pin != "" && pin != agent.DefaultPinPath {
		detach += " --pin-path " + pin
	}
	var (
		foreign  *agent.ForeignProgramError
		busy     *agent.BusyError
		running  *agent.AgentRunningError
		incompat *agent.IncompatiblePinError
	)
	switch {
	case errors.As(err, &foreign) && !foreign.HeldByLink:
		return fmt.Errorf("%w (pass --replace to replace it)", err)
	case errors.As(err, &busy):
		return fmt.Errorf("%w: stop the agent that holds it, or run with its --pin-path, or remove it with tierlimit detach --iface %s --pin-path P", err, busy.Iface)
	case errors.As(err, &running):
		return fmt.Errorf("%w: stop it first", err)
	case errors.As(err, &incompat):
		return fmt.Errorf("%w (remove them with %s)", err, detach)
	case errors.Is(err, agent.ErrNativeRefused):
		return fmt.Errorf("%w (try --xdp-mode generic, or auto to fall back)", err)
	case errors.Is(err, agent.ErrDuplicateInterface):
		return usageError{fmt.Errorf("--iface: %w", err)}
	case errors.Is(err, agent.ErrPinPath):
		return fmt.Errorf("--pin-path: %w", err)
	}
	return err
}
