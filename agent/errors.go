package agent

import (
	"errors"
	"fmt"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/agent/record"
)

// Sentinel errors. The typed errors below wrap them, so errors.Is works on
// either; the command words them for a person (flags, commands to run).
var (
	// ErrXDPMode is returned by ParseXDPMode for an unknown mode.
	ErrXDPMode = errors.New("unknown XDP mode")
	// ErrNoInterface is returned by New when an interface does not exist.
	ErrNoInterface = pin.ErrNoInterface
	// ErrDuplicateInterface is returned by New when two of the names
	// given are one interface.
	ErrDuplicateInterface = errors.New("interface given twice")
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
	// ErrNotEthernet is returned by New, and logged by Watch for a
	// re-created interface, when an interface's frames do not start with
	// an Ethernet header (*LinkTypeError).
	ErrNotEthernet = errors.New("interface without Ethernet headers")
	// ErrNativeRefused is returned by New when the driver refuses native
	// XDP and the mode is native (generic or auto would work).
	ErrNativeRefused = errors.New("native XDP mode refused by the driver")
	// ErrRecordDir is returned by Reload when a new record.dir cannot be
	// made or written: the reload is refused and the old policy, record
	// dir included, keeps running.
	ErrRecordDir = record.ErrDir
)

// LinkTypeError is an interface whose frames start at the IP header (or
// at some other link header): a TUN device, WireGuard, PPP, an ipip, sit
// or gre tunnel. The program parses Ethernet frames; on such an interface
// it would read address bytes as an EtherType and count nothing, so it is
// not attached there (and a TUN-mode tun runs no XDP in native mode at
// all). A gretap, a vxlan, a TAP device or a macvlan carries Ethernet and
// is fine.
type LinkTypeError struct {
	Iface string
	// Type is the link type as netlink names it (ARPHRD_*): "none" for a
	// TUN device or WireGuard, "ppp", "ipip", "gre", "sit", "tunnel6"...
	Type string
}

func (e *LinkTypeError) Error() string {
	return fmt.Sprintf("%v: %s is of link type %q; tierlimit parses Ethernet frames only: attach it to the Ethernet interface the traffic arrives on",
		ErrNotEthernet, e.Iface, e.Type)
}

func (e *LinkTypeError) Unwrap() error { return ErrNotEthernet }

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
