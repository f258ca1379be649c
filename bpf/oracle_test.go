package bpf_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// oracleSeeds run in every CI run, with one new seed beside them.
var oracleSeeds = []uint64{1, 2, 3, 0x5eed}

// oracleCasesPerSeed keeps a run of TestKernelOracle well under a minute.
const oracleCasesPerSeed = 600

// The pair's fixed MACs, so that both runs send the very same bytes.
var (
	oracleCollMAC = net.HardwareAddr{0x02, 0x00, 0x5e, 0x00, 0x00, 0x01}
	oracleSendMAC = net.HardwareAddr{0x02, 0x00, 0x5e, 0x00, 0x00, 0x02}
)

// TestKernelOracle is the differential test of DESIGN.md §2 "The kernel is
// the oracle": seeded random mutations of UDP/514 datagrams and TCP SYNs to
// 601 and 6514 (oracle_frames_test.go) are sent raw on a veth into a
// namespace with a UDP socket on 514 and TCP listeners on 601 and 6514.
// Run 1 has no program: it records which ids the kernel delivered (UDP) or
// answered with a SYN-ACK (TCP). Run 2, in a fresh pair with the same
// frames, has the program attached in enforce mode with a window where
// every counted packet is dropped. An id delivered in both runs is an
// evasion, and fails the test with its mutations. The reverse, a frame the
// program counts (BPF_PROG_TEST_RUN, stats before and after) whose id the
// kernel did not deliver in run 1, is an amplification: logged by mutation
// kind, not failed, since a datagram whose first fragment is fine may still
// be lost to a later one the program never sees whole.
//
// The seeds are oracleSeeds and one drawn for this run, logged;
// TIERLIMIT_ORACLE_SEED=N runs seed N alone.
func TestKernelOracle(t *testing.T) {
	testenv.Require(t)
	seeds := append([]uint64{}, oracleSeeds...)
	if s := os.Getenv("TIERLIMIT_ORACLE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("TIERLIMIT_ORACLE_SEED=%q: %v", s, err)
		}
		seeds = []uint64{v}
	} else {
		seeds = append(seeds, uint64(time.Now().UnixNano()))
	}
	t.Logf("seeds %v (replay one with TIERLIMIT_ORACLE_SEED=N)", seeds)
	n := oracleNet{
		collMAC: oracleCollMAC, sendMAC: oracleSendMAC,
		coll4: netip.MustParseAddr("198.51.100.1"), send4: netip.MustParseAddr("198.51.100.2"),
		coll6: netip.MustParseAddr("2001:db8:51::1"), send6: netip.MustParseAddr("2001:db8:51::2"),
	}
	var cases []oracleCase
	for _, seed := range seeds {
		r := rand.New(rand.NewPCG(seed, 0x0dac1e))
		for range oracleCasesPerSeed {
			cases = append(cases, genCase(r, len(cases), n))
		}
	}

	got1 := oracleRun(t, cases, nil)
	l, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got2 := oracleRun(t, cases, l)

	delivered := 0
	var evasions []string
	for _, c := range cases {
		if got1[c.id] {
			delivered++
		}
		if got1[c.id] && got2[c.id] {
			evasions = append(evasions, c.String())
		}
	}
	t.Logf("%d cases, %d frames; the kernel delivered %d in run 1, %d in run 2", len(cases), countFrames(cases), delivered, len(got2))
	if len(got1) == 0 {
		t.Fatal("run 1 delivered nothing: the harness is broken")
	}
	amplified := reportAmplification(t, l, cases, got1)
	for _, e := range evasions {
		t.Errorf("evasion: %s", e)
	}
	for k := range strictKinds {
		for _, e := range amplified[k] {
			t.Errorf("amplification of a kind the program must get right: %s", e)
		}
	}
}

// saturatedPolicy counts the default's traffic in a window that drops
// every counted packet: max 1, one tier from 100% at 100%; its dests:
// local resolved to local, as the agent resolves it.
func saturatedPolicy(local []tiers.LocalDest) tiers.Policy {
	p := ordinalDefault()
	p.Max = 1
	p.Window = time.Hour
	p.Tiers = []tiers.Tier{{At: tiers.Pct(100), Drop: tiers.Pct(100)}}
	return p.WithLocal(local)
}

func countFrames(cs []oracleCase) int {
	n := 0
	for _, c := range cs {
		n += len(c.frames)
	}
	return n
}

// reportAmplification runs every frame through the program (test_run) and
// logs, by mutation kind, the cases it counts whose id run 1 did not see
// delivered; it returns them by kind.
func reportAmplification(t *testing.T, l *bpf.Limiter, cases []oracleCase, delivered map[int]bool) map[string][]string {
	t.Helper()
	byKind := map[string][]string{}
	counted := 0
	for _, c := range cases {
		hit := false
		for _, f := range c.frames {
			if len(f) < 14 {
				continue
			}
			s0, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Program().Run(&ebpf.RunOptions{Data: f}); err != nil {
				t.Fatalf("test_run %s: %v", c.String(), err)
			}
			s1, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if s1.SelectedPackets() != s0.SelectedPackets() {
				hit = true
			}
		}
		if hit {
			counted++
		}
		if hit && !delivered[c.id] {
			byKind[c.kind] = append(byKind[c.kind], c.String())
		}
	}
	kinds := make([]string, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	t.Logf("the program counts %d cases", counted)
	for _, k := range kinds {
		ex := byKind[k]
		t.Logf("amplification [%s]: %d cases counted that the kernel did not deliver, e.g.\n\t%s", k, len(ex), strings.Join(ex[:min(len(ex), 4)], "\n\t"))
	}
	return byKind
}

// oracleRun sends every case's frames into a fresh pair, with l attached
// to the collector's veth when not nil, and returns the ids the kernel
// delivered: UDP datagrams read from the socket, SYNs answered.
func oracleRun(t *testing.T, cases []oracleCase, l *bpf.Limiter) map[int]bool {
	t.Helper()
	p := testenv.NewPair(t)
	var collIdx, sendIdx int
	if err := p.Coll.Do(func() error {
		lk, err := setupOracleColl(p)
		collIdx = lk
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Send.Do(func() error {
		lk, err := netlink.LinkByName(p.SendIf)
		if err != nil {
			return err
		}
		sendIdx = lk.Attrs().Index
		return netlink.LinkSetHardwareAddr(lk, oracleSendMAC)
	}); err != nil {
		t.Fatal(err)
	}
	got := &idSet{m: map[int]bool{}}
	stop := startOracleListeners(t, p, got)
	defer stop()
	local := waitOracleLocal(t, p)
	if l != nil {
		attachSaturated(t, p, l, collIdx, local)
	}
	var fd int
	if err := p.Send.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: sendIdx})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	done := make(chan struct{})
	go captureSynAcks(fd, got, done)
	sent := 0
	for _, c := range cases {
		for _, f := range c.frames {
			if err := unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Ifindex: sendIdx, Halen: 6}); err != nil && !errors.Is(err, unix.EMSGSIZE) {
				t.Fatalf("send %s: %v", c.String(), err)
			}
			if sent++; sent%32 == 0 {
				time.Sleep(time.Millisecond) // the veth's XDP ring holds 256 frames
			}
		}
	}
	got.waitQuiet(500*time.Millisecond, 10*time.Second)
	unix.Shutdown(fd, unix.SHUT_RDWR)
	close(done)
	return got.snapshot()
}

// waitOracleLocal waits, in both runs, until the collector's namespace
// has both its addresses' local routes (the IPv6 one comes once the veth
// has its carrier: frames sent before are lost to run 1 and would read as
// discards), and returns its local destinations, as the agent reads them.
func waitOracleLocal(t *testing.T, p *testenv.Pair) []tiers.LocalDest {
	t.Helper()
	return waitLocalDests(t, p.Coll, netip.PrefixFrom(p.CollAddr, 32), netip.PrefixFrom(p.CollAddr6, 128))
}

// attachSaturated applies, in the collector's namespace, the saturated
// policy with dests: local resolved to local, and attaches l to the
// collector's veth (native mode) until t ends.
func attachSaturated(t *testing.T, p *testenv.Pair, l *bpf.Limiter, collIdx int, local []tiers.LocalDest) {
	t.Helper()
	if err := p.Coll.Do(func() error {
		pol := saturatedPolicy(local)
		tab, err := tiers.Compile(pol, l.Tick())
		if err != nil {
			return err
		}
		if err := l.Apply(context.Background(), tab); err != nil {
			return err
		}
		// The collector's veth as the agent describes it (no master, no
		// children, route_localnet off), and lo, where the reverse
		// report's test runs arrive, the same.
		ifs := []bpf.Iface{{Index: collIdx, MAC: oracleCollMAC, CheckMAC: true, Martians: true, LocalnetMartian: true}}
		ifs = append(ifs, bpf.Iface{Index: 1, MAC: oracleCollMAC, CheckMAC: true, Martians: true, LocalnetMartian: true})
		if unchecked, err := l.SetIfaces(ifs); err != nil || len(unchecked) > 0 {
			return fmt.Errorf("describe the veth and lo: %v left unchecked: %v", unchecked, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	attachNative(t, p.Coll, l, collIdx)
}

// setupOracleColl gives the collector's veth its fixed MAC, routes back to
// any source through the sender (so that every SYN-ACK leaves on the veth,
// where the sender captures it), and a neighbour for the on-link source
// the frames spoof, and for the sender's addresses. Returns the veth's
// ifindex.
func setupOracleColl(p *testenv.Pair) (int, error) {
	lk, err := netlink.LinkByName(p.CollIf)
	if err != nil {
		return 0, err
	}
	if err := netlink.LinkSetHardwareAddr(lk, oracleCollMAC); err != nil {
		return 0, err
	}
	for _, gw := range []netip.Addr{p.SendAddr, p.SendAddr6} {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: lk.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return 0, fmt.Errorf("default route via %v: %w", gw, err)
		}
	}
	// The sender's own addresses too: a SYN-ACK leaves at once, with no
	// neighbour discovery that a tentative address would not answer.
	for _, a := range []string{"198.51.100.77", "2001:db8:51::77", p.SendAddr.String(), p.SendAddr6.String()} {
		nb := &netlink.Neigh{LinkIndex: lk.Attrs().Index, State: netlink.NUD_PERMANENT, IP: net.ParseIP(a), HardwareAddr: oracleSendMAC}
		if err := netlink.NeighSet(nb); err != nil {
			return 0, fmt.Errorf("neighbour %s: %w", a, err)
		}
	}
	return lk.Attrs().Index, nil
}

// idSet is the ids delivered, as they arrive.
type idSet struct {
	mu   sync.Mutex
	m    map[int]bool
	last time.Time
}

func (s *idSet) add(id int) {
	s.mu.Lock()
	s.m[id] = true
	s.last = time.Now()
	s.mu.Unlock()
}

func (s *idSet) snapshot() map[int]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]bool, len(s.m))
	for k := range s.m {
		out[k] = true
	}
	return out
}

// waitQuiet returns once nothing arrived for quiet, or after limit.
func (s *idSet) waitQuiet(quiet, limit time.Duration) {
	start := time.Now()
	s.mu.Lock()
	s.last = start
	s.mu.Unlock()
	for time.Since(start) < limit {
		time.Sleep(50 * time.Millisecond)
		s.mu.Lock()
		idle := time.Since(s.last)
		s.mu.Unlock()
		if idle >= quiet {
			return
		}
	}
}

// startOracleListeners opens, inside the collector's namespace, UDP
// sockets on 514 (one per family) and TCP listeners on 601 and 6514
// (dual-stack), and records the id of each datagram read.
func startOracleListeners(t *testing.T, p *testenv.Pair, got *idSet) (stop func()) {
	t.Helper()
	var (
		udps []*net.UDPConn
		tcps []net.Listener
	)
	err := p.Coll.Do(func() (err error) {
		// One UDP socket per family, as collectors bind them: an IPv6
		// socket takes no IPv4 multicast (its mc_all is off).
		for _, a := range []struct {
			network string
			ip      net.IP
		}{{"udp4", net.IPv4zero}, {"udp6", net.IPv6unspecified}} {
			u, err := net.ListenUDP(a.network, &net.UDPAddr{IP: a.ip, Port: 514})
			if err != nil {
				return err
			}
			udps = append(udps, u)
		}
		for _, port := range []string{"601", "6514"} {
			ln, err := net.Listen("tcp", "[::]:"+port)
			if err != nil {
				return err
			}
			tcps = append(tcps, ln)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, udp := range udps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 65536)
			for {
				n, from, err := udp.ReadFromUDP(buf)
				if err != nil {
					return
				}
				if id, ok := datagramID(buf[:n], from.Port); ok {
					got.add(id)
				}
			}
		}()
	}
	return func() {
		for _, udp := range udps {
			udp.Close()
		}
		for _, ln := range tcps {
			ln.Close()
		}
		wg.Wait()
	}
}

// datagramID is the id a delivered datagram carries: in its payload, or,
// when the kernel delivered too little of it to hold one (a UDP length
// cut short), in its source port (30000 + id; ids below 30000).
func datagramID(payload []byte, sport int) (int, bool) {
	var id int
	if _, err := fmt.Sscanf(string(payload), "oracle id=%d;", &id); err == nil {
		return id, true
	}
	if len(payload) < len("oracle id=0000000;") && sport >= 30000 {
		return sport - 30000, true
	}
	return 0, false
}

// captureSynAcks reads the frames the collector sends back and records
// the id of each SYN-ACK (its ack less 1 less 0x40000000).
func captureSynAcks(fd int, got *idSet, done chan struct{}) {
	buf := make([]byte, 65536)
	tv := unix.Timeval{Usec: 100000}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	for {
		select {
		case <-done:
			return
		default:
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if id, ok := synAckID(buf[:n]); ok {
			got.add(id)
		}
	}
}

// synAckID parses an untagged Ethernet frame holding a TCP SYN-ACK.
func synAckID(f []byte) (int, bool) {
	if len(f) < 14 {
		return 0, false
	}
	var tcp []byte
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		if len(f) < 34 || f[23] != 6 {
			return 0, false
		}
		tcp = f[14+int(f[14]&0xf)*4:]
	case 0x86dd:
		if len(f) < 54 || f[20] != 6 {
			return 0, false
		}
		tcp = f[54:]
	default:
		return 0, false
	}
	if len(tcp) < 20 || tcp[13]&0x12 != 0x12 {
		return 0, false
	}
	ack := binary.BigEndian.Uint32(tcp[8:]) - 1 - 0x40000000
	return int(ack), ack < 1<<24
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
