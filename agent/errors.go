package agent

import (
	"errors"
	"fmt"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/agent/record"
)

// Sentinel errors. The typed errors below wrap them, so errors.Is works on
// either; the command words them for a person (flags, commands to run).
// The interfaces' errors are agent/attach's.
var (
	// ErrNoInterface is returned by New when an interface does not exist.
	ErrNoInterface = pin.ErrNoInterface
	// ErrForeignProgram is returned by New and Detach when an interface
	// runs an XDP program that is not tierlimit's (*ForeignProgramError).
	ErrForeignProgram = pin.ErrForeignProgram
	// ErrInterfaceBusy is returned by New when an interface already runs
	// a tierlimit limiter that this agent does not own: another agent
	// holds it, or it is pinned under another pin path (*BusyError).
	ErrInterfaceBusy = pin.ErrInterfaceBusy
	// ErrNotRoot is returned by New when the process lacks root.
	ErrNotRoot = errors.New("not running as root: loading and attaching XDP needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN")
	// ErrNotPinned is returned by Detach and Status when no pinned state exists.
	ErrNotPinned = pin.ErrNotPinned
	// ErrAgentRunning is returned by New and Detach when another agent
	// holds the pin path (*AgentRunningError).
	ErrAgentRunning = pin.ErrAgentRunning
	// ErrIncompatiblePin is returned by New when maps pinned under the pin
	// path do not match this version's program (*IncompatiblePinError).
	// Nothing has been written; Detach removes them.
	ErrIncompatiblePin = errors.New("pinned maps are incompatible with this version")
	// ErrNewerLayout is returned for pinned state of a newer layout
	// (*NewerLayoutError).
	ErrNewerLayout = pin.ErrNewerLayout
	// ErrPinPath is returned by New for a pin path bpffs cannot hold.
	ErrPinPath = pin.ErrPinPath
	// ErrRecordDir is returned by Reload when a new record.dir cannot be
	// made or written: the reload is refused and the old policy, record
	// dir included, keeps running.
	ErrRecordDir = record.ErrDir
)

// The pin directory's errors, which New, Detach and ReadStatus return
// alike (agent/pin).
type (
	ForeignProgramError = pin.ForeignProgramError
	BusyError           = pin.BusyError
	AgentRunningError   = pin.AgentRunningError
	NewerLayoutError    = pin.NewerLayoutError
	PrivateBPFFSError   = pin.PrivateBPFFSError
)

// ErrPrivateBPFFS is returned by New (*PrivateBPFFSError) when the bpffs
// at the pin path is private to the agent's mount namespace.
var ErrPrivateBPFFS = pin.ErrPrivateBPFFS

// IncompatiblePinError names the pinned map that does not match.
type IncompatiblePinError struct {
	Pin string
	Err error
}

func (e *IncompatiblePinError) Error() string {
	return fmt.Sprintf("%v under %s: %v", ErrIncompatiblePin, e.Pin, e.Err)
}

func (e *IncompatiblePinError) Unwrap() []error { return []error{ErrIncompatiblePin, e.Err} }
