package main

import (
	"errors"

	"github.com/tierlimit/tierlimit/agent"
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

// explain adds to err the hint for a typed error of agent or tiers that
// reads the same from every command; err otherwise.
func explain(err error) error {
	var hint string
	switch {
	case err == nil:
		return nil
	case errors.Is(err, tiers.ErrEmptyConfig):
		hint = "'tierlimit check' without --config prints the defaults"
	case errors.Is(err, agent.ErrNativeRefused):
		hint = "try --xdp-mode generic, or auto to fall back"
	case errors.Is(err, agent.ErrIncompatiblePins):
		hint = "'tierlimit detach --iface IF --pin-path P' removes them, or pass another --pin-path"
	default:
		return err
	}
	return hinted{err, hint}
}

// explainRun words the errors of agent.New for run.
func explainRun(err error, f runFlags) error {
	switch {
	case errors.Is(err, agent.ErrForeignProgram) && !f.replace:
		return hinted{err, "pass --replace to replace it"}
	case errors.Is(err, agent.ErrPinnedElsewhere):
		return hinted{err, "run with that --pin-path, or remove it with 'tierlimit detach --iface IF --pin-path P'"}
	}
	return err
}

// explainDetach words the errors of agent.Detach for detach.
func explainDetach(err error) error {
	if errors.Is(err, agent.ErrPinnedElsewhere) {
		return hinted{err, "pass that --pin-path"}
	}
	return err
}
