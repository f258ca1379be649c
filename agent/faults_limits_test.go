package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// Faults of limits and names (issue 11 C10–C13, D): the lock follows the
// pinned state, prefix and port-range limits hold at start and reload,
// unusual interface names are pinned and adopted, and conflicting pin
// directories or interfaces are refused before anything is written.
// Shared helpers are in faults_test.go.

// TestLockIsThePinnedState (C10): the lock follows the pinned state, not
// the spelling of its path, and survives the removal of its file under /run.
func TestLockIsThePinnedState(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	a := startPinned(t, p, pinPath, defaultPolicy())
	t.Cleanup(func() { a.Close(); p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) }) })
	t.Chdir(filepath.Dir(pinPath))
	wantRunning := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, pin.ErrAgentRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d)", os.Getpid())) {
			t.Errorf("%s: %v, want ErrAgentRunning naming pid %d", what, err, os.Getpid())
		}
	}
	for _, spelling := range []string{filepath.Base(pinPath), "./" + filepath.Base(pinPath), "../bpf/" + filepath.Base(pinPath) + "/"} {
		wantRunning("detach --pin-path "+spelling, p.Coll.Do(func() error { return pin.Detach(spelling, p.CollIf) }))
		_, err := newAgent(p, agent.Config{PinPath: spelling}, defaultPolicy())
		wantRunning("second agent with --pin-path "+spelling, err)
	}
	// A half-written lock file (the holder between truncate and write) does
	// not make the pid unreadable: it comes from the kernel.
	if err := os.Truncate(pin.LockFile(pinPath), 0); err != nil {
		t.Fatal(err)
	}
	_, err := newAgent(p, agent.Config{PinPath: pinPath}, defaultPolicy())
	wantRunning("second agent, empty lock file", err)
	// tmpfiles removes the lock file: the pin directory's own lock holds.
	if err := os.Remove(pin.LockFile(pinPath)); err != nil {
		t.Fatal(err)
	}
	_, err = newAgent(p, agent.Config{PinPath: pinPath}, defaultPolicy())
	wantRunning("second agent, lock file removed", err)
	wantRunning("detach, lock file removed", p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) }))
	if _, err := os.Stat(filepath.Join(pinPath, "links", p.CollIf)); err != nil {
		t.Fatalf("the running agent's pins were touched: %v", err)
	}
	if act, err := a.Limiter().Active(); err != nil || act.Max != 100 {
		t.Fatalf("the running agent's policy changed: %+v %v", act, err)
	}
}

// prefixes returns n distinct IPv4 /24s (10.0.0.0/24 ...) and n IPv6 /64s.
func prefixes(n int) (v4, v6 []netip.Prefix) {
	for i := range n {
		v4 = append(v4, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
		v6 = append(v6, netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xee, 0, byte(i >> 8), byte(i)}), 64))
	}
	return v4, v6
}

// TestPrefixLimits (C11): a policy with tiers.MaxPrefixes exempt sources
// and as many dests starts, reloads unchanged again and again, and exempts;
// one more is refused by Validate (what check runs) and by New alike,
// naming the key.
func TestPrefixLimits(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	v4, v6 := prefixes(tiers.MaxPrefixes)
	pol := defaultPolicy()
	pol.Exempt = append(v4[:tiers.MaxPrefixes-1:tiers.MaxPrefixes-1], netip.MustParsePrefix("198.51.100.0/24"))
	pol.Select = append(pol.Select, tiers.Rule{Proto: tiers.ProtoUDP, Ports: []tiers.PortRange{{First: 515, Last: 515}}, Dests: v6})
	a := startAgent(t, p, attach.XDPAuto, pol)
	for i := range 3 {
		if err := a.Reload(context.Background(), pol); err != nil {
			t.Fatalf("reload %d of the unchanged policy: %v", i+1, err)
		}
	}
	sendUDP(t, p, 514, 5)
	if st, err := a.Limiter().Stats(); err != nil || st.Exempt.Packets != 5 {
		t.Fatalf("exempt %d (%v), want 5 from the last of %d exempt prefixes", st.Exempt.Packets, err, len(pol.Exempt))
	}

	over := pol
	over.Exempt = append(slicesClone(pol.Exempt), netip.MustParsePrefix("192.0.2.0/24"))
	checkErr := over.Validate()
	var ce *tiers.ConfigError
	if !errors.As(checkErr, &ce) || ce.Key != "exempt.sources" || !errors.Is(checkErr, tiers.ErrTooMany) || !strings.Contains(checkErr.Error(), strconv.Itoa(tiers.MaxPrefixes)) {
		t.Fatalf("Validate with %d exempt prefixes: %v, want ErrTooMany on exempt.sources naming %d", len(over.Exempt), checkErr, tiers.MaxPrefixes)
	}
	if err := a.Reload(context.Background(), over); err == nil || err.Error() != checkErr.Error() {
		t.Fatalf("reload with one prefix too many: %v, want the same error as check: %v", err, checkErr)
	}

	// A reload that rewrites every prefix gives up when its context ends
	// (SIGTERM), and the old policy stays, whole.
	changed := pol
	changed.Max = 77
	changed.Exempt = nil
	for _, e := range pol.Exempt {
		b := e.Addr().As4()
		b[0]++
		changed.Exempt = append(changed.Exempt, netip.PrefixFrom(netip.AddrFrom4(b), e.Bits()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Reload(ctx, changed); !errors.Is(err, context.Canceled) {
		t.Fatalf("reload with an ended context: %v, want context.Canceled", err)
	}
	if act, err := a.Limiter().Active(); err != nil || act.Max != 100 {
		t.Fatalf("after an abandoned reload: max %d (%v), want the old 100", act.Max, err)
	}
	if err := a.Reload(context.Background(), changed); err != nil {
		t.Fatalf("reload after an abandoned one: %v", err)
	}
	if act, _ := a.Limiter().Active(); act.Max != 77 {
		t.Fatalf("after the reload: max %d, want 77", act.Max)
	}
}

func slicesClone[T any](s []T) []T { return append([]T(nil), s...) }

// TestManyPortRanges (C12): 100,000 overlapping port ranges cost a start
// and a reload no more than a policy of one port: the ranges are merged
// before the port array is written. The bound is 5 s for each, against
// 18 s before.
func TestManyPortRanges(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pol := defaultPolicy()
	var rs []tiers.PortRange
	for i := range 100000 {
		// Wide, overlapping ranges: written port by port, they would be
		// 6·10^9 writes into the array.
		first := uint16(1 + (i*7919)%1000)
		rs = append(rs, tiers.PortRange{First: first, Last: 65535 - uint16(i%100)})
	}
	pol.Select = []tiers.Rule{{Proto: tiers.ProtoUDP, Ports: rs}}
	start := time.Now()
	a := startAgent(t, p, attach.XDPAuto, pol)
	started := time.Since(start)
	start = time.Now()
	if err := a.Reload(context.Background(), pol); err != nil {
		t.Fatal(err)
	}
	reloaded := time.Since(start)
	t.Logf("100,000 port ranges: start %v, reload %v", started, reloaded)
	if started > 5*time.Second || reloaded > 5*time.Second {
		t.Errorf("start %v, reload %v: want each under 5s", started, reloaded)
	}
	sendUDP(t, p, 514, 3)
	if st, _ := a.Limiter().Stats(); st.SelectedPackets() != 3 {
		t.Errorf("%d selected, want 3 (port 514 is in a range)", st.SelectedPackets())
	}
}

// TestDottedAndLongInterfaceNames (C13): VLAN-style names with a dot and
// 15-character names (IFNAMSIZ-1) are pinned, listed, adopted on restart
// and detached.
func TestDottedAndLongInterfaceNames(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	// VLAN sub-interface names; any interface may carry them, and veth
	// needs no module.
	names := []string{"tlv" + sandbox.RandHex(2) + ".100", "tl" + sandbox.RandHex(4) + ".4094", "tl" + sandbox.RandHex(6) + "z"}
	for _, n := range names {
		vethIn(t, p.Coll, n)
	}
	if len(names[1]) != 15 || len(names[2]) != 15 {
		t.Fatalf("test names %q are not 15 characters", names[1:])
	}
	for _, n := range names {
		detachAtEnd(t, p, pinPath, n)
	}
	for run := range 2 {
		var logs testenv.SyncBuffer
		a, err := newAgent(p, agent.Config{PinPath: pinPath, Interfaces: names, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, defaultPolicy())
		if err != nil {
			t.Fatalf("run %d on %q: %v", run+1, names, err)
		}
		a.Close()
		if run == 1 && strings.Count(logs.String(), "adopted pinned link") != len(names) {
			t.Errorf("restart did not adopt every link:\n%s", logs.String())
		}
	}
	st, err := agent.ReadStatus(pinPath)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range st.Links {
		got = append(got, l.Iface)
	}
	if strings.Join(got, " ") != strings.Join(sortedCopy(names), " ") {
		t.Errorf("status lists %q, want %q", got, sortedCopy(names))
	}
	for _, n := range names {
		if err := p.Coll.Do(func() error { return pin.Detach(pinPath, n) }); err != nil {
			t.Errorf("detach %s: %v", n, err)
		}
		if x := testenv.XDP(t, p.Coll, n); x.ID != 0 {
			t.Errorf("%s still runs %+v", n, x)
		}
	}
}

// TestPinName: every byte an interface name may hold survives the
// encoding, and no encoded name holds a dot (bpffs refuses those).
func TestPinName(t *testing.T) {
	for _, n := range []string{"eth0", "eth0.100", "a.b.c", "x%2Ey", "%", "%25.", "vlan.4094", "..."} {
		enc := pin.PinName(n)
		if strings.Contains(enc, ".") || pin.UnpinName(enc) != n {
			t.Errorf("PinName(%q) = %q, back %q", n, enc, pin.UnpinName(enc))
		}
	}
}

func sortedCopy(s []string) []string {
	c := slicesClone(s)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if pin.PinName(c[j]) < pin.PinName(c[i]) {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

// TestIncompatiblePinDir (D): a pinned map whose spec differs from this
// version's (here an unrecorded window of 8 bytes) is migrated, not
// refused (docs/design.md §11): the agent starts on maps of its own, logs it,
// and leaves its layout recorded; Detach removes it all.
func TestIncompatiblePinDir(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	pinPath := testenv.PinPath(t, pin.LockFile)
	if err := os.MkdirAll(filepath.Join(pinPath, "maps"), 0o700); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "window", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(pinPath, "maps", "window")); err != nil {
		t.Fatal(err)
	}
	old.Close()
	var logs testenv.SyncBuffer
	a, err := newAgent(p, agent.Config{PinPath: pinPath, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, defaultPolicy())
	if err != nil {
		t.Fatalf("start on a pin dir whose window map differs: %v, want a migration", err)
	}
	if !strings.Contains(logs.String(), "migrated pinned state") || !strings.Contains(logs.String(), "window") {
		t.Errorf("the migration is not logged, naming the window:\n%s", logs.String())
	}
	sendUDP(t, p, 514, 5)
	a.Close()
	st, err := agent.ReadStatus(pinPath)
	if err != nil || st.Layout.Version != bpf.Layout || !st.Layout.Recorded || st.Stats.SelectedPackets() != 5 {
		t.Errorf("status after the migration: %v, layout %v, %d selected, want layout %d and 5", err, st.Layout, st.Stats.SelectedPackets(), bpf.Layout)
	}
	if err := p.Coll.Do(func() error { return pin.Detach(pinPath, p.CollIf) }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pinPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("detach left %s (%v)", pinPath, err)
	}
}

// TestSecondUnpinnedAgent (D): a second agent without pinning is told that
// another agent holds the interface.
func TestSecondUnpinnedAgent(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	startAgent(t, p, attach.XDPAuto, defaultPolicy())
	_, err := newAgent(p, agent.Config{}, defaultPolicy())
	var busy *pin.BusyError
	if !errors.As(err, &busy) || busy.Iface != p.CollIf || !errors.Is(err, pin.ErrInterfaceBusy) {
		t.Fatalf("second unpinned agent: %v, want a BusyError for %s", err, p.CollIf)
	}
}

// TestDuplicateInterface (D): an interface given twice is refused before
// anything is attached.
func TestDuplicateInterface(t *testing.T) {
	testenv.Require(t)
	p := newPair(t)
	_, err := newAgent(p, agent.Config{Interfaces: []string{p.CollIf, p.CollIf}}, defaultPolicy())
	if !errors.Is(err, attach.ErrDuplicateInterface) || !strings.Contains(err.Error(), p.CollIf) {
		t.Fatalf("--iface %s twice: %v, want ErrDuplicateInterface naming it", p.CollIf, err)
	}
	if x := testenv.XDP(t, p.Coll, p.CollIf); x.ID != 0 {
		t.Fatalf("refused start attached %+v", x)
	}
}
