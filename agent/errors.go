package agent

import (
	"errors"
	"fmt"
)

// Sentinel errors. The typed errors below wrap them, so errors.Is works on
// either; the command words them for a person (flags, commands to run).
// The rooms' errors are their own: the interfaces' are agent/attach's,
// the pin directory's agent/pin's (pin.ErrNoInterface, pin.ErrAgentRunning,
// *pin.BusyError...), the shed record's agent/record's (record.ErrDir,
// which Reload returns for a record.dir it cannot make or write).
var (
	// ErrNotRoot is returned by New when the process lacks root.
	ErrNotRoot = errors.New("not running as root: loading and attaching XDP needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN")
	// ErrIncompatiblePin is returned by New when maps pinned under the pin
	// path do not match this version's program (*IncompatiblePinError).
	// Nothing has been written; pin.Detach removes them.
	ErrIncompatiblePin = errors.New("pinned maps are incompatible with this version")
)

// IncompatiblePinError names the pinned map that does not match.
type IncompatiblePinError struct {
	Pin string
	Err error
}

func (e *IncompatiblePinError) Error() string {
	return fmt.Sprintf("%v under %s: %v", ErrIncompatiblePin, e.Pin, e.Err)
}

func (e *IncompatiblePinError) Unwrap() []error { return []error{ErrIncompatiblePin, e.Err} }
