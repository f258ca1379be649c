package automax

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

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
// socket and /proc files stay that namespace's. Entering needs
// CAP_SYS_ADMIN, which the shipped unit does not give: a /proc/PID/ns/net
// that cannot be entered is read through /proc/PID/net/udp and udp6
// instead (SignalProcNet). Any other path is followed: when it names
// another namespace (the collector's container recreated), the signal is
// opened there again at the next read.
func OpenDropSourceIn(path string) (DropSource, error) {
	if path == "" {
		return OpenDropSource(false)
	}
	open := func(path string) (DropSource, error) {
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
	src, err := open(path)
	if procNSPath.MatchString(path) {
		if err == nil {
			return src, nil // the process's namespace: it ends with the process
		}
		p, perr := openProcNet(path)
		if perr != nil {
			return nil, &SignalNetNSError{Path: path, Err: fmt.Errorf("%w; /proc/PID/net/udp: %v", err, perr)}
		}
		return p, nil
	}
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			err = fmt.Errorf("%w (entering another network namespace needs CAP_SYS_ADMIN, which the shipped unit does not give: "+
				"name a process of the collector instead, /proc/PID/ns/net, whose sockets are read without entering it)", err)
		}
		return nil, err
	}
	ino, err := nsInode(path)
	if err != nil {
		return src, nil
	}
	return &followedNS{path: path, ino: ino, inner: src, open: open}, nil
}
