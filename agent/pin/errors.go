package pin

import (
	"errors"
	"fmt"

	"github.com/tierlimit/tierlimit/bpf"
)

// Sentinel errors of the pin directory and of Detach; the agent returns
// them too. The typed errors below wrap them, so errors.Is works on either.
var (
	// ErrNoInterface is returned by New when an interface does not exist.
	ErrNoInterface = errors.New("no such interface")
	// ErrForeignProgram is returned by New and Detach when an interface
	// runs an XDP program that is not tierlimit's (*ForeignProgramError).
	ErrForeignProgram = errors.New("interface runs another XDP program")
	// ErrInterfaceBusy is returned by New when an interface already runs
	// a tierlimit limiter that this agent does not own: another agent
	// holds it, or it is pinned under another pin path (*BusyError).
	ErrInterfaceBusy = errors.New("interface already runs a tierlimit limiter held elsewhere")
	// ErrNotPinned is returned by Detach and Status when no pinned state exists.
	ErrNotPinned = errors.New("no pinned tierlimit state")
	// ErrAgentRunning is returned by New and Detach when another agent
	// holds the pin path (*AgentRunningError).
	ErrAgentRunning = errors.New("another tierlimit agent is running with this pin path")
	// ErrNewerLayout is returned for pinned state of a newer layout
	// (*NewerLayoutError).
	ErrNewerLayout = errors.New("pinned state was written by a newer tierlimit")
	// ErrPinPath is returned by New for a pin path bpffs cannot hold.
	ErrPinPath = errors.New("bad pin path")
)

// ForeignProgramError is an interface that runs another XDP program.
type ForeignProgramError struct {
	Iface string
	// Program describes it: "program id N, name "x"" (the name only with
	// CAP_SYS_ADMIN).
	Program string
	// HeldByLink is true when a bpf_link holds it: only its owner can
	// remove it, so replacing it is not possible either.
	HeldByLink bool
	// Unnamed is true when its name could not be read (that needs
	// CAP_SYS_ADMIN): it may be another tierlimit agent's.
	Unnamed bool
}

func (e *ForeignProgramError) Error() string {
	if e.Unnamed && !e.HeldByLink {
		return fmt.Sprintf("%v: %s on %s, whose name cannot be read without CAP_SYS_ADMIN: another agent or another tool holds the interface",
			ErrForeignProgram, e.Program, e.Iface)
	}
	if e.HeldByLink {
		return fmt.Sprintf("%v: %s on %s is held by a bpf_link, which only its owner can remove", ErrForeignProgram, e.Program, e.Iface)
	}
	return fmt.Sprintf("%v: %s on %s", ErrForeignProgram, e.Program, e.Iface)
}

func (e *ForeignProgramError) Unwrap() error { return ErrForeignProgram }

// BusyError is an interface that runs a tierlimit limiter this agent does
// not own.
type BusyError struct {
	Iface   string
	Program string
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("%s already runs tierlimit (%s), held by another agent or pinned under another pin path", e.Iface, e.Program)
}

func (e *BusyError) Unwrap() error { return ErrInterfaceBusy }

// AgentRunningError names the pin path another agent holds, and its pid
// ("" when the kernel does not say).
type AgentRunningError struct {
	Pin string
	Pid string
}

func (e *AgentRunningError) Error() string {
	pid := e.Pid
	if pid == "" {
		pid = "unknown"
	}
	return fmt.Sprintf("%v (%s, pid %s)", ErrAgentRunning, e.Pin, pid)
}

func (e *AgentRunningError) Unwrap() error { return ErrAgentRunning }

// NewerLayoutError is returned by New and ReadStatus when the pin
// directory was written by a newer tierlimit, whose layout this binary
// does not know (DESIGN.md §11): reading it could misread any field.
type NewerLayoutError struct {
	Pin   string
	Found Layout
}

func (e *NewerLayoutError) Error() string {
	by := e.Found.WrittenBy
	if by == "" {
		by = "an unknown version"
	}
	return fmt.Sprintf("%v: %s holds layout %d, written by tierlimit %s; this tierlimit knows layouts up to %d",
		ErrNewerLayout, e.Pin, e.Found.Version, by, bpf.Layout)
}

func (e *NewerLayoutError) Unwrap() error { return ErrNewerLayout }
