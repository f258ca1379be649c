package bpf_test

// The peers of issue 42: XDP programs built out of tree by
// deploy/bench/peers.sh from their public sources at pinned commits, each
// loaded from its object and given the map entries its normal pass path
// needs, as its own loader would write them.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// peersDirEnv names the directory of the peers' objects
// (deploy/bench/peers.sh's output; make bench's PEERS_DIR).
const peersDirEnv = "TIERLIMIT_PEERS_DIR"

// peer is one peer program: its object in the peers' directory, the
// program in it, how to set up its maps, and the frame its path takes.
type peer struct {
	name, object, program string
	// setup writes the map entries of the normal pass path.
	setup func(coll *ebpf.Collection) error
	// tcpSYN: the peer judges TCP SYNs (L3AF), not UDP syslog.
	tcpSYN bool
}

// peers are issue 42's peers in the order of its table.
var peers = []peer{
	// xdp-filter's allow mode (a listed match drops, the rest passes)
	// with UDP ports only, one rule listed (UDP destination port 9999):
	// the syslog datagram to 514 is looked up and passed.
	{name: "xdp-filter-udp", object: "xdpfilt_alw_udp.o", program: "xdpfilt_alw_udp", setup: xdpFilterSetup},
	// The same with all its features compiled in (Ethernet, IPv4, IPv6,
	// TCP, UDP): the same rule, every lookup made.
	{name: "xdp-filter-all", object: "xdpfilt_alw_all.o", program: "xdpfilt_alw_all", setup: xdpFilterSetup},
	// XDP-Firewall as configured at its commit (filters, per-flow rate
	// statistics, IPv6, bpf_loop over the rules) with one rule: drop UDP
	// to destination ports from 9999. The datagram to 514 updates its
	// flow's statistics, misses the rule and passes.
	{name: "xdp-firewall", object: "xdpfw.o", program: "xdp_prog_main", setup: xdpFirewallSetup},
	// L3AF's ratelimiting: TCP SYNs to a listed port counted in a sliding
	// one-second window; port 80 listed at a rate it never reaches, so
	// each SYN is counted and passed (its tail call to a next program
	// finds none and it returns XDP_PASS).
	{name: "l3af-syn", object: "l3af_ratelimiting.o", program: "_xdp_ratelimiting", setup: l3afSetup, tcpSYN: true},
}

// l3afPort is the port L3AF's ratelimiting limits, the SYN's destination.
const l3afPort = 80

// errNoPeer is loadPeer's error when the peers' directory lacks the
// peer's object.
var errNoPeer = errors.New("object not built")

// loadPeer loads p's object from dir (the maps unpinned: pinning by name
// is its own loader's business) and sets up its maps; it returns the
// program, closed when tb ends, or errNoPeer.
func loadPeer(tb testing.TB, dir string, p peer) (*ebpf.Program, error) {
	tb.Helper()
	path := filepath.Join(dir, p.object)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%s: %w", path, errNoPeer)
	}
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	ps, ok := spec.Programs[p.program]
	if !ok {
		return nil, fmt.Errorf("%s: no program %s", path, p.program)
	}
	ps.Type = ebpf.XDP
	// Only the measured program: the others of an object are not loaded.
	for name := range spec.Programs {
		if name != p.program {
			delete(spec.Programs, name)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	tb.Cleanup(coll.Close)
	if err := p.setup(coll); err != nil {
		return nil, fmt.Errorf("%s: set up its maps: %w", p.name, err)
	}
	return coll.Programs[p.program], nil
}

// xdpFilterSetup lists UDP destination port 9999 in xdp-filter's
// filter_ports (a per-CPU array by port in network order; the value's
// flags MAP_FLAG_DST|MAP_FLAG_UDP, xdp-filter/common_kern_user.h).
func xdpFilterSetup(coll *ebpf.Collection) error {
	const mapFlagDst, mapFlagUDP = 1 << 1, 1 << 3
	m := coll.Maps["filter_ports"]
	if m == nil {
		return errors.New("no map filter_ports")
	}
	return putPerCPU(m, uint32(htons(9999)), uint64(mapFlagDst|mapFlagUDP))
}

// xdpFirewallSetup writes XDP-Firewall's rule 0 in map_filters (a per-CPU
// array of filter_t, src/common/types.h): set, enabled, action 0 (drop),
// UDP with a destination port of at least 9999. Rule 1 stays unset, which
// ends the loop over the rules. The fields are placed by the object's BTF.
func xdpFirewallSetup(coll *ebpf.Collection) error {
	m := coll.Maps["map_filters"]
	if m == nil {
		return errors.New("no map map_filters")
	}
	info, err := m.Info()
	if err != nil {
		return err
	}
	id, ok := info.BTFID()
	if !ok {
		return errors.New("map_filters has no BTF")
	}
	h, err := btf.NewHandleFromID(id)
	if err != nil {
		return err
	}
	defer h.Close()
	spec, err := h.Spec(nil)
	if err != nil {
		return err
	}
	var filter *btf.Struct
	if err := spec.TypeByName("filter", &filter); err != nil {
		return fmt.Errorf("the object's BTF: struct filter: %w", err)
	}
	val := make([]byte, m.ValueSize())
	for _, f := range []struct {
		path string
		v    uint64
	}{
		{"set", 1}, {"enabled", 1}, {"action", 0},
		{"udp.enabled", 1}, {"udp.do_dport_min", 1}, {"udp.dport_min", 9999},
	} {
		if err := setField(val, filter, f.path, f.v); err != nil {
			return err
		}
	}
	return putPerCPU(m, uint32(0), val)
}

// l3afSetup writes L3AF ratelimiting's maps as its loader does: the rate
// (rl_config_map[0], connections per second), the port (rl_ports_map, in
// host order), and its two counters at zero.
func l3afSetup(coll *ebpf.Collection) error {
	for _, w := range []struct {
		m string
		k any
		v any
	}{
		{"rl_config_map", uint32(0), uint64(1 << 40)},
		{"rl_ports_map", uint16(l3afPort), uint8(1)},
		{"rl_recv_count_map", uint64(0), uint64(0)},
		{"rl_drop_count_map", uint64(0), uint64(0)},
	} {
		m := coll.Maps[w.m]
		if m == nil {
			return fmt.Errorf("no map %s", w.m)
		}
		if err := m.Put(w.k, w.v); err != nil {
			return fmt.Errorf("%s: %w", w.m, err)
		}
	}
	return nil
}

// putPerCPU writes v for every possible CPU at key k of the per-CPU map m.
func putPerCPU(m *ebpf.Map, k any, v any) error {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	var vals any
	switch x := v.(type) {
	case uint64:
		s := make([]uint64, n)
		for i := range s {
			s[i] = x
		}
		vals = s
	case []byte:
		s := make([][]byte, n)
		for i := range s {
			s[i] = x
		}
		vals = s
	default:
		return fmt.Errorf("putPerCPU: %T", v)
	}
	return m.Put(k, vals)
}

// setField sets the member at path (dotted, through nested structs) of
// the struct s in buf to v, little-endian, bitfields included.
func setField(buf []byte, s *btf.Struct, path string, v uint64) error {
	var off btf.Bits
	t := btf.Type(s)
	for part := range strings.SplitSeq(path, ".") {
		st, ok := btf.UnderlyingType(t).(*btf.Struct)
		if !ok {
			return fmt.Errorf("%s: %s is not in a struct", path, part)
		}
		var mem *btf.Member
		for i := range st.Members {
			if st.Members[i].Name == part {
				mem = &st.Members[i]
			}
		}
		if mem == nil {
			return fmt.Errorf("%s: no member %s", path, part)
		}
		off += mem.Offset
		t = mem.Type
		if mem.BitfieldSize > 0 {
			for i := btf.Bits(0); i < mem.BitfieldSize; i++ {
				bit := off + i
				if v>>i&1 == 1 {
					buf[bit/8] |= 1 << (bit % 8)
				} else {
					buf[bit/8] &^= 1 << (bit % 8)
				}
			}
			return nil
		}
	}
	size, err := btf.Sizeof(t)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	b := buf[off/8:]
	switch size {
	case 1:
		b[0] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	case 8:
		binary.LittleEndian.PutUint64(b, v)
	default:
		return fmt.Errorf("%s: a member of %d bytes", path, size)
	}
	return nil
}
