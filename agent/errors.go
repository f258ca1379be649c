package agent

import "errors"

// Errors of New and Detach that a command words for its user: the agent
// names what happened and where; the command says which flag or command
// fixes it.
var (
	// ErrPinnedElsewhere is returned by New when an interface already runs
	// tierlimit that this agent did not pin (another agent's, or pinned
	// under another pin path), and by Detach when the interface's limiter
	// is held by a bpf_link pinned under another pin path or by a running
	// agent.
	ErrPinnedElsewhere = errors.New("interface runs a tierlimit pinned elsewhere")
	// ErrNativeRefused is returned by New when Config.XDPMode is XDPNative
	// and the driver refuses native XDP; XDPGeneric or XDPAuto would work.
	ErrNativeRefused = errors.New("native XDP refused by the driver")
	// ErrIncompatiblePins is returned by New when the maps pinned under
	// Config.PinPath cannot be reused (a different tierlimit version); the
	// pinned state must be removed (Detach) first.
	ErrIncompatiblePins = errors.New("pinned maps cannot be reused")
)
