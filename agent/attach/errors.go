package attach

import (
	"errors"
	"fmt"
)

// The interfaces' errors. The pin directory's (pin.ErrNoInterface,
// *pin.ForeignProgramError, *pin.BusyError) are agent/pin's; ErrStacked
// is in stacked.go.
var (
	// ErrXDPMode is returned by ParseXDPMode for an unknown mode.
	ErrXDPMode = errors.New("unknown XDP mode")
	// ErrDuplicateInterface is returned by Resolve when two of the names
	// given are one interface.
	ErrDuplicateInterface = errors.New("interface given twice")
	// ErrNotEthernet is returned by Resolve, and logged by Watch for a
	// re-created interface, when an interface's frames do not start with
	// an Ethernet header (*LinkTypeError).
	ErrNotEthernet = errors.New("interface without Ethernet headers")
	// ErrNativeRefused is returned by AttachAll when the driver refuses
	// native XDP and the mode is native (generic or auto would work).
	ErrNativeRefused = errors.New("native XDP mode refused by the driver")
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
