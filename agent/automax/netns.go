package automax

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netns"

	"github.com/tierlimit/tierlimit/internal/sysutil"
)

// ErrSignalNetNS is returned by OpenDropSourceIn when the collector-socket
// drop signal cannot be read in the network namespace it names
// (*SignalNetNSError).
var ErrSignalNetNS = errors.New("cannot read the collector socket drops in the network namespace")

// SignalNetNSError is a network namespace (auto.netns) in which the
// adaptive max's signal cannot be read: the path is not a network
// namespace, cannot be opened or entered, or neither sock_diag nor
// /proc/net/snmp answers there.
type SignalNetNSError struct {
	Path string
	Err  error
}

func (e *SignalNetNSError) Error() string {
	return fmt.Sprintf("%v %s: %v", ErrSignalNetNS, e.Path, e.Err)
}

func (e *SignalNetNSError) Unwrap() []error { return []error{ErrSignalNetNS, e.Err} }

// OpenDropSourceIn opens the collector-socket drop signal (OpenDropSource)
// in the network namespace at path, such as /proc/PID/ns/net or
// /run/netns/NAME, where a collector in a container or pod has its sockets
// (DESIGN.md §8); "" is the calling thread's namespace. It enters the
// namespace on a locked OS thread only to open the source, whose netlink
// socket and /proc files stay that namespace's.
func OpenDropSourceIn(path string) (DropSource, error) {
	if path == "" {
		return OpenDropSource(false)
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, &SignalNetNSError{Path: path, Err: err}
	}
	defer h.Close()
	var src DropSource
	err = sysutil.OnThreadIn(h, "the network namespace "+path, func() (err error) {
		src, err = OpenDropSource(false)
		return err
	})
	if err != nil {
		return nil, &SignalNetNSError{Path: path, Err: err}
	}
	return src, nil
}
