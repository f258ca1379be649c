package automax

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/tiers"
)

// The signals a DropSource reads (docs/design.md §8), as DropSource.Signal
// names them.
const (
	// SignalSockDiag: per-socket drop counts (SK_MEMINFO_DROPS) of the UDP
	// sockets bound to the selected ports, from a sock_diag dump.
	SignalSockDiag = "sock_diag"
	// SignalSNMP: the namespace's UDP receive-buffer errors, /proc/net/snmp
	// Udp RcvbufErrors plus /proc/net/snmp6 Udp6RcvbufErrors, when the
	// kernel answers no sock_diag dump for UDP (no udp_diag). They count
	// every UDP socket of the namespace, not only the collector's.
	SignalSNMP = "snmp"
)

// DropSample is one read of a DropSource.
type DropSample struct {
	// Drops are the receive-buffer drops since the previous read, in
	// datagrams: 0 on the first read, which sets the baseline.
	Drops uint64
	// Sockets is the number of UDP sockets bound to the selected ports
	// now; 0 means the collector is not listening (yet, or restarting).
	Sockets int
	// Full is how full the fullest collector socket's receive buffer is
	// now, 0..1 (bytes queued over SO_RCVBUF's allowance); 0 when the
	// signal cannot tell (SignalSNMP).
	Full float64
}

// DropSource reads the receive-buffer drops of the collector's sockets:
// the UDP sockets bound to the selected ports.
type DropSource interface {
	// Read returns the drops since the previous Read on sockets bound to
	// a port in ports. A socket that closed takes its drops with it; one
	// that appeared since the previous Read counts all of its drops.
	Read(ports []tiers.PortRange) (DropSample, error)
	// Signal is SignalSockDiag or SignalSNMP.
	Signal() string
	// Close releases the source.
	Close() error
}

// OpenDropSource opens the collector-socket drop signal in the calling
// thread's network namespace, which it keeps reading from any goroutine:
// sock_diag when the kernel answers a UDP socket dump (udp_diag), else
// /proc/net/snmp and snmp6. snmpOnly skips the sock_diag attempt.
func OpenDropSource(snmpOnly bool) (DropSource, error) {
	if !snmpOnly {
		d, err := openSockDiag()
		if err == nil {
			return d, nil
		}
		s, serr := openSNMP()
		if serr != nil {
			return nil, fmt.Errorf("socket drops: sock_diag: %v; /proc/net/snmp: %w", err, serr)
		}
		s.why = err
		return s, nil
	}
	return openSNMP()
}

// inPorts reports whether port is in one of ports.
func inPorts(port uint16, ports []tiers.PortRange) bool {
	for _, r := range ports {
		if port >= r.First && port <= r.Last {
			return true
		}
	}
	return false
}

// udpPorts are the ports of p's udp select rules: the collector's.
func udpPorts(p tiers.Policy) []tiers.PortRange {
	var out []tiers.PortRange
	for _, r := range p.Select {
		if r.Proto == tiers.ProtoUDP {
			out = append(out, r.Ports...)
		}
	}
	return out
}

// sock_diag (linux/inet_diag.h, linux/sock_diag.h).
const (
	inetDiagSKMemInfo = 7           // INET_DIAG_SKMEMINFO: u32 sk_meminfo[SK_MEMINFO_VARS]
	sizeofReqV2       = 8 + 48      // struct inet_diag_req_v2
	sizeofDiagMsg     = 4 + 48 + 20 // struct inet_diag_msg
)

// sockDiag reads SK_MEMINFO_DROPS of every UDP socket through a
// NETLINK_SOCK_DIAG socket, made in the namespace it reads.
type sockDiag struct {
	mu    sync.Mutex
	fd    int
	seq   uint32
	buf   []byte
	delta socketDelta
}

// socketDelta turns per-socket drop counters into the drops since the
// previous read: a socket seen before adds what its counter grew by, one
// that appeared since adds all of its drops (none on the first read, which
// only sets the baselines), and a socket gone or reset adds nothing.
type socketDelta struct {
	prev   map[uint64]uint64 // socket inode -> drops at the previous read
	primed bool
}

// next returns the drops since the previous call of cur, the drops of each
// socket by inode, and keeps cur as the next baseline.
func (d *socketDelta) next(cur map[uint64]uint64) uint64 {
	var drops uint64
	for ino, n := range cur {
		if p, ok := d.prev[ino]; ok && n >= p {
			drops += n - p
		} else if d.primed && !ok {
			drops += n
		}
	}
	d.prev, d.primed = cur, true
	return drops
}

func openSockDiag() (*sockDiag, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("netlink sock_diag socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind netlink sock_diag socket: %w", err)
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
	d := &sockDiag{fd: fd, buf: make([]byte, 64<<10)}
	// A dump that works, with the drops in it, or the fallback.
	if _, err := d.dump(unix.AF_INET, nil); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return d, nil
}

func (d *sockDiag) Signal() string { return SignalSockDiag }

func (d *sockDiag) Close() error { return unix.Close(d.fd) }

func (d *sockDiag) Read(ports []tiers.PortRange) (DropSample, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur := map[uint64]uint64{}
	var s DropSample
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if _, err := d.dump(fam, func(port uint16, inode uint64, mem skMem) {
			if inPorts(port, ports) {
				cur[inode] = mem.drops
				if mem.rcvbuf > 0 {
					s.Full = max(s.Full, float64(mem.rmem)/float64(mem.rcvbuf))
				}
			}
		}); err != nil {
			return DropSample{}, err
		}
	}
	s.Sockets = len(cur)
	s.Drops = d.delta.next(cur)
	return s, nil
}

// dump asks for every UDP socket of family with its sk_meminfo and calls
// fn with each one's local port, inode and memory counters. It returns the number of
// sockets; one without the meminfo is an error (the kernel ignored the
// request for it).
func (d *sockDiag) dump(family uint8, fn func(port uint16, inode uint64, mem skMem)) (int, error) {
	d.seq++
	req := make([]byte, unix.NLMSG_HDRLEN+sizeofReqV2)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(req[8:], d.seq)
	r := req[unix.NLMSG_HDRLEN:]
	r[0], r[1], r[2] = family, unix.IPPROTO_UDP, 1<<(inetDiagSKMemInfo-1)
	ne.PutUint32(r[4:], 0xffffffff) // every state
	if err := unix.Sendto(d.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag request: %w", err)
	}
	count := 0
	for {
		n, _, err := unix.Recvfrom(d.fd, d.buf, 0)
		if err != nil {
			return 0, fmt.Errorf("sock_diag reply: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(d.buf[:n])
		if err != nil {
			return 0, fmt.Errorf("sock_diag reply: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != d.seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return count, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := -int32(ne.Uint32(m.Data)); errno != 0 {
						return 0, fmt.Errorf("sock_diag udp dump: %w", syscall.Errno(errno))
					}
				}
				return count, nil
			case unix.SOCK_DIAG_BY_FAMILY:
			default:
				continue
			}
			if len(m.Data) < sizeofDiagMsg {
				return 0, errors.New("sock_diag reply: short inet_diag_msg")
			}
			port := binary.BigEndian.Uint16(m.Data[4:])
			inode := uint64(ne.Uint32(m.Data[68:]))
			mem, ok := parseSKMem(m.Data[sizeofDiagMsg:])
			if !ok {
				return 0, errors.New("sock_diag reply without SK_MEMINFO_DROPS")
			}
			count++
			if fn != nil {
				fn(port, inode, mem)
			}
		}
	}
}

// skMem are the sk_meminfo counters the controller reads.
type skMem struct {
	rmem, rcvbuf, drops uint64 // bytes queued, SO_RCVBUF allowance, drops
}

// parseSKMem finds INET_DIAG_SKMEMINFO in the attributes b.
func parseSKMem(b []byte) (skMem, bool) {
	ne := binary.NativeEndian
	for len(b) >= unix.SizeofRtAttr {
		l, typ := int(ne.Uint16(b)), ne.Uint16(b[2:])
		if l < unix.SizeofRtAttr || l > len(b) {
			return skMem{}, false
		}
		if typ == inetDiagSKMemInfo {
			v := b[unix.SizeofRtAttr:l]
			if len(v) < 4*(unix.SK_MEMINFO_DROPS+1) {
				return skMem{}, false
			}
			u := func(i int) uint64 { return uint64(ne.Uint32(v[4*i:])) }
			return skMem{rmem: u(unix.SK_MEMINFO_RMEM_ALLOC), rcvbuf: u(unix.SK_MEMINFO_RCVBUF), drops: u(unix.SK_MEMINFO_DROPS)}, true
		}
		b = b[min(len(b), (l+3)&^3):]
	}
	return skMem{}, false
}

// snmp reads the namespace-wide UDP receive-buffer errors and finds the
// collector's sockets in /proc/net/udp and udp6. The files are opened once,
// through /proc/thread-self, so they stay those of the namespace they were
// opened in.
type snmp struct {
	mu                      sync.Mutex
	snmp4, snmp6, udp, udp6 *os.File
	prev                    uint64
	primed                  bool
	why                     error // why sock_diag was not used, for the log
}

func openSNMP() (*snmp, error) {
	s := &snmp{}
	for _, f := range []struct {
		dst  **os.File
		name string
	}{{&s.snmp4, "snmp"}, {&s.snmp6, "snmp6"}, {&s.udp, "udp"}, {&s.udp6, "udp6"}} {
		fh, err := os.Open("/proc/thread-self/net/" + f.name)
		if err != nil && f.name != "snmp" && errors.Is(err, os.ErrNotExist) {
			continue // no IPv6
		}
		if err != nil {
			s.Close()
			return nil, err
		}
		*f.dst = fh
	}
	if _, err := s.rcvbufErrors(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *snmp) Signal() string { return SignalSNMP }

func (s *snmp) Close() error {
	for _, f := range []*os.File{s.snmp4, s.snmp6, s.udp, s.udp6} {
		if f != nil {
			f.Close()
		}
	}
	return nil
}

func (s *snmp) Read(ports []tiers.PortRange) (DropSample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.rcvbufErrors()
	if err != nil {
		return DropSample{}, err
	}
	var out DropSample
	if s.primed && n >= s.prev {
		out.Drops = n - s.prev
	}
	s.prev, s.primed = n, true
	for _, f := range []*os.File{s.udp, s.udp6} {
		c, err := countSockets(f, ports)
		if err != nil {
			return DropSample{}, err
		}
		out.Sockets += c
	}
	return out, nil
}

func reread(f *os.File) ([]byte, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return b, nil
}

// rcvbufErrors sums Udp RcvbufErrors (snmp) and Udp6RcvbufErrors (snmp6).
func (s *snmp) rcvbufErrors() (uint64, error) {
	b, err := reread(s.snmp4)
	if err != nil {
		return 0, err
	}
	// "Udp: InDatagrams ... RcvbufErrors ..." then "Udp: 1 2 ...".
	var head []string
	var total uint64
	found := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i := 1; i < len(head) && i < len(f); i++ {
			if head[i] == "RcvbufErrors" {
				if total, err = strconv.ParseUint(f[i], 10, 64); err != nil {
					return 0, fmt.Errorf("%s: Udp RcvbufErrors %q: %w", s.snmp4.Name(), f[i], err)
				}
				found = true
			}
		}
		break
	}
	if !found {
		return 0, fmt.Errorf("%s: no Udp RcvbufErrors", s.snmp4.Name())
	}
	if s.snmp6 == nil {
		return total, nil
	}
	if b, err = reread(s.snmp6); err != nil {
		return 0, err
	}
	sc = bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "Udp6RcvbufErrors" {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: Udp6RcvbufErrors %q: %w", s.snmp6.Name(), f[1], err)
			}
			total += n
		}
	}
	return total, nil
}

// countSockets counts the lines of /proc/net/udp{,6} whose local port is
// in ports ("sl local_address rem_address ...", local_address "ADDR:PORT"
// in hex).
func countSockets(f *os.File, ports []tiers.PortRange) (int, error) {
	if f == nil {
		return 0, nil
	}
	b, err := reread(f)
	if err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		_, hex, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hex, 16, 16); err == nil && inPorts(uint16(p), ports) {
			n++
		}
	}
	return n, nil
}
