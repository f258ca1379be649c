package automax

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// SignalProcNet: per-socket drop counts of the UDP sockets bound to the
// selected ports, from the drops column of /proc/PID/net/udp and udp6 of
// a process in the collector's namespace: read without entering the
// namespace, so with the shipped unit's capabilities (no CAP_SYS_ADMIN),
// for an auto.netns of the form /proc/PID/ns/net. It cannot tell how full
// a socket is (DropSample.Full is 0).
const SignalProcNet = "proc_net_udp"

// procNSPath matches /proc/PID/ns/net.
var procNSPath = regexp.MustCompile(`^/proc/([0-9]+)/ns/net$`)

// procNetDrops reads SignalProcNet from dir, /proc/PID/net.
type procNetDrops struct {
	mu    sync.Mutex
	dir   string
	delta socketDelta
}

// openProcNet opens SignalProcNet for the namespace at path, which must
// be /proc/PID/ns/net, and reads it once.
func openProcNet(path string) (*procNetDrops, error) {
	m := procNSPath.FindStringSubmatch(path)
	if m == nil {
		return nil, fmt.Errorf("%s is not /proc/PID/ns/net", path)
	}
	p := &procNetDrops{dir: "/proc/" + m[1] + "/net"}
	if _, err := p.sockets(nil); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *procNetDrops) Signal() string { return SignalProcNet }
func (p *procNetDrops) Close() error   { return nil }

func (p *procNetDrops) Read(ports []tiers.PortRange) (DropSample, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, err := p.sockets(ports)
	if err != nil {
		return DropSample{}, err
	}
	return DropSample{Sockets: len(cur), Drops: p.delta.next(cur)}, nil
}

// sockets reads udp and udp6 (absent without IPv6): the drops of each
// socket bound to a port in ports, by inode (all sockets with nil ports).
func (p *procNetDrops) sockets(ports []tiers.PortRange) (map[uint64]uint64, error) {
	cur := map[uint64]uint64{}
	for _, name := range []string{"udp", "udp6"} {
		f, err := os.Open(p.dir + "/" + name)
		if name == "udp6" && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			if errors.Is(err, syscall.ESRCH) || errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%s: the process is gone (the collector restarted? name a process of the new one): %w", p.dir, err)
			}
			return nil, err
		}
		err = parseProcUDP(f, func(port uint16, inode, drops uint64) {
			if ports == nil || inPorts(port, ports) {
				cur[inode] = drops
			}
		})
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", p.dir, name, err)
		}
	}
	return cur, nil
}

// parseProcUDP calls fn with the local port, inode and drops of each
// socket line of a /proc/net/udp or udp6 file (udp4_format_sock):
// sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
// ref pointer drops.
func parseProcUDP(f *os.File, fn func(port uint16, inode, drops uint64)) error {
	sc := bufio.NewScanner(f)
	if !sc.Scan() || !strings.Contains(sc.Text(), "drops") {
		return errors.New("no header with a drops column")
	}
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 13 {
			return fmt.Errorf("line %q: want 13 fields", sc.Text())
		}
		_, hexPort, ok := strings.Cut(fl[1], ":")
		port, err1 := strconv.ParseUint(hexPort, 16, 16)
		inode, err2 := strconv.ParseUint(fl[9], 10, 64)
		drops, err3 := strconv.ParseUint(fl[12], 10, 64)
		if !ok || err1 != nil || err2 != nil || err3 != nil {
			return fmt.Errorf("line %q: cannot parse", sc.Text())
		}
		fn(uint16(port), inode, drops)
	}
	return sc.Err()
}

// followedNS is a DropSource opened in the network namespace at a path
// such as /run/netns/NAME, opened there again when the path names another
// namespace (its inode changed: the collector's container was recreated),
// so that the signal never stays on a dead namespace. The first Read after
// a reopen is the new namespace's baseline (Drops 0).
type followedNS struct {
	mu    sync.Mutex
	path  string
	ino   uint64
	inner DropSource
	open  func(string) (DropSource, error)
}

// nsInode is the inode of the namespace file at path (stat follows it).
func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func (f *followedNS) Signal() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inner.Signal()
}

func (f *followedNS) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inner.Close()
}

func (f *followedNS) Read(ports []tiers.PortRange) (DropSample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ino, err := nsInode(f.path)
	if err != nil {
		return DropSample{}, fmt.Errorf("network namespace %s: %w", f.path, err)
	}
	if ino != f.ino {
		src, err := f.open(f.path)
		if err != nil {
			return DropSample{}, fmt.Errorf("network namespace %s was recreated, and cannot be read: %w", f.path, err)
		}
		f.inner.Close()
		f.inner, f.ino = src, ino
		s, err := src.Read(ports)
		s.Drops = 0
		return s, err
	}
	return f.inner.Read(ports)
}
